"""revgate: release engineering for LLM model revisions.

The repository keeps one folder per part (manifests/, registry/, evaluation/, shadow/, promotion/,
rollback/, serving/, flows/, cli/, zoo/); pyproject.toml maps each into this package, so an install
adds the single import name ``revgate`` (``revgate.flows``, ``revgate.serving.router``, ...).
Extras match the hosts: ``[router]``, ``[worker]``, ``[control]``, ``[zoo]`` (docs/fleet.md).
"""

__version__ = "0.1.0"
