"""Node health: the checks' reports and verdicts, the failure history, and heal's rules."""
