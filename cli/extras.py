"""Which extra a command needs, from the installed distribution's own metadata.

Each host installs only its part (``revgate[router]`` on an edge host, ``revgate[worker]`` on a
GPU host, ``revgate[control]`` where flows run). A command that reaches for a library its host's
extra does not carry fails with the pip command that adds it, never with a bare ImportError.
"""

from __future__ import annotations

import re
from importlib import metadata

from revgate.manifests.errors import RevgateError

DISTRIBUTION = "revgate"
# Import names whose distribution is named otherwise; the rest are their distribution's name.
DISTRIBUTION_OF = {"model_signing": "model-signing", "OpenSSL": "pyopenssl", "yaml": "pyyaml"}
# The extra each host kind installs to run these commands; a library several extras carry is
# asked for by the command's own.
COMMAND_EXTRA = {"router": "router", "worker": "worker", "models": "zoo"}
CONTROL = "control"  # every other command that reaches past the bare install talks to Prefect or MLflow
_EXTRA = re.compile(r"""^(?P<name>[A-Za-z0-9._-]+).*;\s*extra\s*==\s*["'](?P<extra>[a-z0-9_-]+)["']""")


class ExtraMissing(RevgateError):
    """A command needs a library that none of this host's installed extras provide."""


def extras_providing(requirements: list[str], module: str) -> list[str]:
    """The extras (besides ``dev``) whose requirements install the top-level import ``module``."""
    wanted = _normalise(DISTRIBUTION_OF.get(module, module))
    found = []
    for requirement in requirements:
        match = _EXTRA.match(requirement)
        if match and _normalise(match["name"]) == wanted and match["extra"] != "dev":
            found.append(match["extra"])
    return sorted(set(found))


def missing_extra(error: ModuleNotFoundError, command: str) -> ExtraMissing | None:
    """The explanation for ``error`` raised by ``revgate COMMAND``; None when no extra provides it."""
    module = (error.name or "").partition(".")[0]
    try:
        requirements = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return None
    extras = extras_providing(requirements, module)
    if not module or not extras:
        return None
    own = COMMAND_EXTRA.get(command, CONTROL)
    extra = own if own in extras else extras[0]
    either = " or ".join(f"[{name}]" for name in extras)
    return ExtraMissing(
        f"`revgate {command}` needs {module}, which this installation lacks (the {either} extra installs it)",
        where=f"the Python environment of {DISTRIBUTION} {metadata.version(DISTRIBUTION)}",
        fix=f'Install the part this host runs: pip install "revgate[{extra}]" (docs/fleet.md: one extra per host kind)',
    )


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
