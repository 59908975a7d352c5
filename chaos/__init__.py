"""The fault-injection harness: the real pipeline as separate processes, faults at every protocol step.

``krishiv chaos --seed S --duration D`` runs the scenario matrix (then random scenarios until the duration
is spent) against a broker of its own, checks every table against an independent oracle after each
scenario, and writes a JSON report. See :mod:`chaos.scenarios`.
"""
