"""Public checks, one module per exercise; students have them and run them."""
