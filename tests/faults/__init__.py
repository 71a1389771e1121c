"""The fault suite (issue 11): break Redis, workers and the receiver while messages flow, and count.

``scripts/faults --help``; modules: :mod:`.harness` (processes, counting, the table),
:mod:`.scenarios`, :mod:`.receiver` (the webhook receiver process), :mod:`.targets` (the
poison callable), :mod:`.settings` (Django settings from ``FAULTS_*`` variables),
:mod:`.cli`.
"""
