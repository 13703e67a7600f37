import sys
from pathlib import Path

# Let the test modules import the shared helper module (scaling_synth) in any import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))
