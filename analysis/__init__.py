"""Statistics and claim verdicts over the trial table: torch-free, read by the sweep's adaptive looks and
by the report alike."""
