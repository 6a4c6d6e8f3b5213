"""Configs, tasks, one trial, Optuna studies and workers, W&B tracking and the `ablate` command line."""
