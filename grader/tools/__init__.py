"""The authors' tools: the mistake catalogue's table and the points in the notebooks, the
messages' catalogues, the translated notebooks. They import the layers below the front ends."""
