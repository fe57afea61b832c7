"""ReMax for OpenRLHF: files that run inside the OpenRLHF environment (copied into each launch directory or run
with that environment's python), never imported by the harness itself; see harness/frameworks/openrlhf/__init__.py."""
