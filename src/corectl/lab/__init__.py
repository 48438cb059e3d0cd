"""The stand-in cluster: systemd containers that play DGX and head nodes on this machine."""
