"""table.md from runs.txt, by the summarize.py of 2026-11-28_xeon-2c_diloco-overlap-int4 with this
record's configurations: python summarize.py > table.md"""
import runpy
import sys
from pathlib import Path

here = Path(__file__).parent
sys.argv = [sys.argv[0], str(here), "overlap0-fragments1", "overlap2-fragments1", "overlap2-fragments4"]
runpy.run_path(str(here.parent / "2026-11-28_xeon-2c_diloco-overlap-int4" / "summarize.py"), run_name="__main__")
