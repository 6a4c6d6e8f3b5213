"""The study's schema: what a study file (spec.py), a config (config.py) and a stored trial (trials.py) are,
torch-free and below both harness/ and analysis/, which read it alike."""
