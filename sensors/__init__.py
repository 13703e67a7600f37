"""Sensors and schedules of the code location."""

from __future__ import annotations

import dagster as dg

from sensors.new_files import new_user_files
from sensors.phase_controller import phase_controller
from sensors.schedules import nightly_evals

# Declarative automation: assets whose code, default config or upstream version changed
# are re-materialised by this sensor (running by default when the daemon runs).
automation = dg.AutomationConditionSensorDefinition(
    "marin_automation", target=dg.AssetSelection.all(), default_status=dg.DefaultSensorStatus.RUNNING, minimum_interval_seconds=60
)

all_sensors = [new_user_files, phase_controller, automation]

all_schedules = [nightly_evals]
