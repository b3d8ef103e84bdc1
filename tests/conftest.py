import sys
from pathlib import Path

# tests import the repo's top-level modules (model, sample, ...) as a user running from the root would
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
