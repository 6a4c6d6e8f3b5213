"""The install a user meets: the README's first command brings what a study needs and no test tools; its
test command brings the rest."""

from __future__ import annotations

import re
import tomllib

from conftest import REPO


def readme_command(marker: str) -> str:
    """The README's command on the line after `<!-- marker -->` and its code fence (what .ci/run runs)."""
    return (REPO / "README.md").read_text().split(f"<!-- {marker} -->\n```bash\n")[1].splitlines()[0]


def installed_requirements(command: str) -> set[str]:
    """The names of the requirements a command's `pip install -e .[extras]` brings, extras followed."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names, extras = set(), []
    for target in re.findall(r"pip install (?:-\S+ )*-e (\S+)", command):
        names |= {re.match(r"[\w.-]+", r)[0] for r in project["dependencies"]}
        extras += re.findall(r"\w+", target.strip("'\"").removeprefix(".").strip("[]"))
    while extras:
        for requirement in project["optional-dependencies"][extras.pop()]:
            name, wanted = re.fullmatch(r"([\w.-]+)(?:\[([\w,]+)\])?.*", requirement).groups()
            if name == project["name"]:
                extras += wanted.split(",")
            else:
                names.add(name)
    return names


def test_the_quickstart_installs_what_a_study_needs_and_the_test_command_the_rest():
    quickstart = installed_requirements(readme_command("quickstart-command"))
    tests = installed_requirements(readme_command("test-command"))
    assert {"torch", "lightning", "optuna"} <= quickstart
    assert not quickstart & {"pytest", "moto", "mutmut", "ruff"}
    assert {"pytest", "moto", "setuptools", "boto3", "optuna-dashboard"} <= tests and "mutmut" not in tests
