"""One use case per module, behind the CLI commands: each imports the domain packages and the
Ansible boundary (corectl.ansible), never another command (pyproject.toml's layer contracts)."""
