"""Runs fanned out over runner hosts: shards, job packs, the runner hosts themselves, the fanned run."""
