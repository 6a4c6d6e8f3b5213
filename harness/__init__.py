"""What runs a study: the tasks and their data, one trial (or seeds fused into one model) with its training
rules and callbacks, evaluation and artifacts; the study's Optuna storage, queue, adaptive looks and checks
(study/); the workers and where they start (launchers/); W&B tracking."""
