"""`ablate bench`: how fast the harness trains, decodes and sweeps."""
