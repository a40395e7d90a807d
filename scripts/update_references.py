"""Rewrite the generated config references in docs/configuration.md.

Each `<!-- reference: python -m X -->` ... `<!-- end of reference -->` block
is replaced by what `python -m X` prints now (tests/config/test_config.py checks
they agree). Run after changing a key's default or help: `make references`.
"""
import re
import subprocess
import sys
from pathlib import Path

GUIDE = Path(__file__).parents[1] / "docs" / "configuration.md"
BLOCK = re.compile(r"(<!-- reference: python -m (\S+) -->\n)(.*?)(<!-- end of reference -->)", re.S)


def printed(module: str) -> str:
    return subprocess.run([sys.executable, "-m", module], check=True, capture_output=True,
                          text=True).stdout


def main() -> None:
    text = GUIDE.read_text()
    new = BLOCK.sub(lambda m: m[1] + printed(m[2]) + m[4], text)
    GUIDE.write_text(new)
    print(f"{GUIDE}: {'updated' if new != text else 'already current'}")


if __name__ == "__main__":
    main()
