"""The measurements behind the figures in docs/: one script per question, each run from the repository root as
`python -m benchmarks.NAME` (README.md here lists them and the page that cites each). Not shipped in the wheel.

Scripts import draftheads and each other by their full names (`benchmarks.cpu_training`); the one test helper they
use is `tests.fixtures`. peer_runners/ is not part of the package: its scripts run inside another virtualenv.
"""
