"""Generated messages and stubs of echokv.v1 (see tools/generate_stubs.py)."""
