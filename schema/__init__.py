"""The study's schema: what a study file, a config and a stored trial are, torch-free and below both harness/
and analysis/, which read it alike. spec.py the study file (StudySpec); config.py ExperimentConfig and
TrainConfig (models/config.py's ModelConfig and task_config.py's TaskConfig inside); tasks.py the task
registry's names and keys; trials.py what a stored trial holds and how its variant and seed are read;
metric_registry.py every metric; names.py names that become folders; errors.py the two kinds of failure."""
