"""setup.cfg lists packages by hand (callbacks/ is mapped in): none may be missing."""
import configparser
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_in_setup_cfg():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    listed = set(config["options"]["packages"].split())
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "kerasjit").rglob("__init__.py")}
    found |= {"kerasjit.callbacks"}
    assert found <= listed, f"add to setup.cfg [options] packages: {sorted(found - listed)}"
