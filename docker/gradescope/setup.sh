#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image from the zip that
# `python -m grader gradescope-bundle` writes (unpacked in /autograder/source). It installs
# what the grader needs, from the lab's lock, into a virtual environment of its own.
#
# Gradescope has no GPU: the stand-in devices grade as on a GPU server. Choose its Ubuntu
# 24.04 base image (Python 3.12); the lab needs Python 3.11 or newer.
set -euo pipefail
source=${AUTOGRADER_ROOT:-/autograder}/source
venv=${AUTOGRADER_ROOT:-/autograder}/venv
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "setup.sh: the lab needs Python 3.11 or newer, this image has $(python3 --version 2>&1); choose Gradescope's Ubuntu 24.04 base image" >&2
    exit 1
}
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    apt-get update -q && apt-get install -y -q python3-venv
fi
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check \
    -r "$source/requirements/lab.txt"
"$venv/bin/python" -c 'import torch, nbformat; print("setup.sh: torch", torch.__version__)'
# Gradescope's default memory, 768 MB, is too little: grading peaks at about 1.8 GB.
echo "setup.sh: in this assignment's Autograder Settings, give the autograder 2 GB of memory or more"
