"""Sensors and schedules of the code location.

The sensors that drive an asset are factories (``phase_controller_sensor``,
``user_shards_sensor``; ``ladder_band_check``, the check that shares the phase controller's
``LadderWatch``) that take the asset definitions; definitions.py builds them, so no sensor
module imports an asset module.
"""

from __future__ import annotations

import dagster as dg

from sensors.ladder_band import ladder_band_check
from sensors.ladder_watch import LadderWatch
from sensors.phase_controller import phase_controller_sensor
from sensors.schedules import nightly_evals
from sensors.user_shards import user_shards_sensor

# Declarative automation: assets whose code, default config or upstream version changed
# are re-materialised by this sensor (running by default when the daemon runs).
automation = dg.AutomationConditionSensorDefinition(
    "marin_automation", target=dg.AssetSelection.all(), default_status=dg.DefaultSensorStatus.RUNNING, minimum_interval_seconds=60
)

all_schedules = [nightly_evals]

__all__ = ["LadderWatch", "all_schedules", "automation", "ladder_band_check", "phase_controller_sensor", "user_shards_sensor"]
