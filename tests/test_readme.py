"""The README's two commands are what a new user runs, and CI runs the second one."""

import re

from conftest import ROOT


def readme_commands():
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())[:2]


def test_readme_opens_with_the_setup_and_test_commands():
    main_job, tests = readme_commands()
    assert main_job.startswith("pip install torch==2.13.0") and "visualspec generate" in main_job
    assert tests.startswith("pip install torch==2.13.0") and "pytest" in tests


def test_ci_runs_the_readme_test_command():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert readme_commands()[1] in ci
