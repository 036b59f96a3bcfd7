"""The commands, above the pipeline: `run` (run.py), `plan` (plan.py), `submit` (submit.py),
`doctor` (doctor.py) and `make-tiny-model` (models.py), and the gate every one of them passes
(gate.py: the overrides composed once by compose.py and read into the run's typed configuration,
checked before Ray or any worker starts). roll_device/cli.py parses the command line and calls
them; nothing below this package imports it."""
