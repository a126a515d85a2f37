"""Example worker-side code: small real torch models the demo and tests register."""
