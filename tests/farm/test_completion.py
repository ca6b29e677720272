"""Shell completion: ``farm --show-completion bash`` prints a script, and the script's protocol completes."""
from __future__ import annotations

import os
import subprocess
import sys


def test_bash_completion_script_and_completions() -> None:
    # without a shell to detect (CI runs pytest under no interactive shell), Typer's `--show-completion`
    # takes the shell's name as its value only with detection off
    no_detect = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    script = subprocess.run([sys.executable, "-m", "farm", "--show-completion", "bash"], capture_output=True,
                            text=True, timeout=60, env=no_detect)
    assert script.returncode == 0 and "_FARM_COMPLETE=complete_bash" in script.stdout
    env = {**os.environ, "_FARM_COMPLETE": "complete_bash", "COMP_WORDS": "farm wor", "COMP_CWORD": "1"}
    words = subprocess.run([sys.executable, "-m", "farm"], capture_output=True, text=True, env=env, timeout=60)
    assert set(words.stdout.split()) == {"worker", "workers"}
    env.update(COMP_WORDS="farm db ", COMP_CWORD="2")
    assert "upgrade" in subprocess.run([sys.executable, "-m", "farm"], capture_output=True, text=True, env=env,
                                       timeout=60).stdout.split()
