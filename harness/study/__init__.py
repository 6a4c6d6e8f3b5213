"""A study: its spec (study file, no Optuna), its Optuna storage, and its queue of trials and progress."""
