"""Partitions of the code location, in one module that assets, sensors and schedules import.

Sensors never import an asset module: what they share with the assets (a dynamic partition
set) lives here, and the asset itself is handed to the sensor factory in definitions.py.
"""

from __future__ import annotations

import dagster as dg

# One partition per phase of the demo run (train/demo, eval/demo); the phase controller adds them.
demo_phases = dg.DynamicPartitionsDefinition(name="demo_phases")

# One partition per user file (normalized/user); the new-files sensor adds them.
user_files = dg.DynamicPartitionsDefinition(name="user_files")
