import subprocess
import sys

import jevany_client


def test_import_stays_light():
    code = (
        "import sys, jevany_client\n"
        "heavy = [m for m in ('torch', 'transformers', 'typer', 'numpy') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == ""


def test_public_names_are_exported():
    for name in (
        "JevanyError",
        "OverloadedError",
        "ERROR_CLASSES",
        "error_from_wire",
        "Choice",
        "Noul",
        "Score",
        "questions_to_wire",
        "parse_decision",
        "DecisionRequest",
        "PROTOCOL_VERSION",
    ):
        assert name in jevany_client.__all__
        assert hasattr(jevany_client, name)
    assert jevany_client.PROTOCOL_VERSION == 1
