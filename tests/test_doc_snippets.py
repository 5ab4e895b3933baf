"""Every fenced block of README.md and docs/*.md runs, is checked, or says why not, and every
`hpckit` command and option, `HPCKIT_*` variable and `hpckit.*` name the pages mention exists.
How a block is marked: tests/support/doc_snippets.py."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import run
from support.once import computed_once
from support.doc_snippets import (
    ENV_NAME,
    GENERATED,
    PAGES,
    ROOT,
    SHELLS,
    Block,
    all_blocks,
    cli_problems,
    code_texts,
    example_option_problems,
    hpckit_invocations,
    normalised,
    package_text,
    parses_as_json,
    python_names,
    sbatch_problems,
    transcript,
    transcript_problem,
    unread_env_names,
    unresolved,
)

from hpckit.cli import main

BLOCKS = all_blocks()
ENV = {"HPCKIT_TENSORBOARD": "0", "HPCKIT_STORAGE": "", "PATH": f"{Path(sys.executable).parent}:"
       f"{os.environ['PATH']}"}

# --- completions: what a block needs from around it, kept small -----------------------------

TRAIN_LOOP_SETUP = '''
import os, tempfile
import torch
import hpckit
from hpckit import Checkpoint, CheckpointConfig, RunConfig
from torch.utils.data import DataLoader
from hpckit.torch import TorchTrainer, prepare_data_loader, prepare_model


class TransformerBlock(torch.nn.Linear):
    def __init__(self):
        super().__init__(4, 4)


def train_step():
    return 0.5


def save(model, directory):
    torch.save(model.state_dict(), os.path.join(directory, "model.pt"))


def train_loop(config):
    model = torch.nn.Sequential(TransformerBlock(), torch.nn.Linear(4, 1))
    rank = hpckit.get_context().get_world_rank()
    shard_state = model.state_dict()
    loss, metrics, start, steps, d = 0.5, {"loss": 0.5}, 0, 3, tempfile.mkdtemp()
    local_checkpoint = Checkpoint.from_directory(tempfile.mkdtemp())
'''
# Only where the block names them (else a NameError says so): an optimizer's first parameter
# group imports torch._dynamo, 2 to 3 s of CPU that a block without one would pay for nothing.
TRAIN_LOOP_OPTIMIZER = '''    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = {"model": model, "optimizer": optimizer}
'''
TRAIN_LOOP_FIT = '''

if __name__ == "__main__":
    TorchTrainer(train_loop, run_config=RunConfig(storage_path=os.getcwd(), name="snippet")).fit()
'''

FINISHED_RUN = '''
import os, tempfile
import pyarrow.fs
import hpckit
from hpckit import Checkpoint, CheckpointConfig, DataParallelTrainer, RunConfig


def train_loop(config):
    for epoch in range(3):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "model.pt"), "w") as f:
                f.write(str(epoch))
            hpckit.report({"loss": 1 / (epoch + 1), "epoch": epoch},
                          checkpoint=Checkpoint.from_directory(d))


trainer = DataParallelTrainer(train_loop, run_config=RunConfig(
    storage_path=os.path.expanduser("~/hpckit_results"), name="linear",
    checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss",
                                       checkpoint_score_order="min")))
result = trainer.fit()
'''

HPCKIT_NAMES = '''
import hpckit
from hpckit import *  # noqa: F403
from hpckit.torch import TorchTrainer


def train_loop(config):
    pass
'''

HDF5_FILE = '''
import h5py, numpy
with h5py.File("fmnist.h5", "w") as f:
    f["train/images"] = numpy.zeros((8, 28, 28), dtype="float32")
    f["train/labels"] = numpy.zeros(8, dtype="int64")
'''


def _in_train_loop(code: str) -> str:
    """The block as the body of a training function; `for x in ...:` goes round twice."""
    code = re.sub(r"\bin \.\.\.:", "in range(2):", code)
    setup = TRAIN_LOOP_SETUP
    if re.search(r"\b(optimizer|state)\b", code):
        setup += TRAIN_LOOP_OPTIMIZER
    return setup + "".join("    " + line + "\n" for line in code.splitlines()) + TRAIN_LOOP_FIT


COMPLETIONS = {
    "train-loop": _in_train_loop,
    "hdf5-train-loop": lambda code: HDF5_FILE + _in_train_loop(
        code.replace("/lustre/data/fmnist.h5", "fmnist.h5")),
    "finished-run": lambda code: FINISHED_RUN + code,
    "hpckit-names": lambda code: HPCKIT_NAMES + code,
    "local-storage": lambda code: code.replace('storage_path="/scratch/me/results"',
                                               "storage_path=os.getcwd()"),
}
# Shell set-up, run in the experiment's copy before the block.
SHELL_COMPLETIONS = {
    "flipped-byte": "python -c \"import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); "
                    "b[-1] ^= 1; open(p, 'wb').write(b)\" $HOME/docrun/linear/checkpoint_000004/model.pt\n",
}
RUNNABLE_COMMAND = re.compile(r"(hpckit|python examples/|mpiexec -n \d+ python examples/)")


def _python_text(block: Block) -> str:
    kind, name = block.marker or ("", "")
    return COMPLETIONS[name](block.text) if kind == "run with" else block.text


def shell_commands(block: Block) -> list[tuple[str, int]] | None:
    """The block's commands, each with the exit status it must end with (a console block's
    ``$ echo $?`` names it); None when the harness cannot run one of them."""
    if block.language == "console":
        commands = []
        for command, output in re.findall(r"^\$ (.*)\n((?:(?!\$ ).*\n)*)", block.text, flags=re.M):
            if command == "echo $?":
                commands[-1] = (commands[-1][0], int(output.split()[0]))
            else:
                commands.append((command, 0))
    else:
        joined = block.text.replace("\\\n", " ")
        commands = [(line, 0) for line in joined.splitlines()
                    if line.strip() and not line.lstrip().startswith("#")]
    if not commands or not all(RUNNABLE_COMMAND.match(command) for command, _ in commands):
        return None
    return commands


def how_checked(block: Block) -> str | None:
    """How the harness accounts for a block, or None if it cannot."""
    if block.page == GENERATED:
        return "generated"  # from --help, and compared with it by tests/test_cli_reference.py
    if block.marker and block.marker[0] == "run with":
        return "python" if block.language == "python" else "shell"
    if block.marker and block.marker[0] == "sample" and block.language == "console":
        return "shell" if shell_commands(block) is not None else None
    if block.marker:
        return block.marker[0]
    if block.is_sbatch:
        return "sbatch"
    if block.language == "json":
        return "json"
    if block.language == "python":
        return "python"
    if block.language in SHELLS and shell_commands(block) is not None:
        return "shell"
    return None


def _of(kind: str) -> list[Block]:
    return [block for block in BLOCKS if how_checked(block) == kind]


# --- every block is accounted for -----------------------------------------------------------

def _marker_problem(block: Block) -> str | None:
    kind, argument = block.marker or ("", "")
    if kind in ("not run", "sample") and len(argument) < 8:
        return f"a `{kind}:` marker needs its reason"
    if kind == "sample" and block.language != "console":
        return "`sample:` marks a console block whose output is an example"
    if kind == "tested by":
        test = ROOT / argument
        if not test.is_file() or block.page.name not in test.read_text():
            return f"`tested by: {argument}`, but that file does not exist or never names {block.page.name}"
    if kind == "run with":
        known = COMPLETIONS if block.language == "python" else SHELL_COMPLETIONS
        if argument not in known:
            return f"no completion {argument!r} (known: {', '.join(sorted(known))})"
    return None


@pytest.mark.quick
def test_every_block_is_run_checked_or_marked():
    problems = []
    for block in BLOCKS:
        problem = _marker_problem(block) if block.marker else None
        if how_checked(block) is None:
            problem = (f"a ```{block.language or '(untagged)'} block the harness cannot run: mark it "
                       "<!-- not run: REASON --> on the line above the fence")
        if problem:
            problems.append(f"{block.id}: {problem}")
    assert not problems, "\n".join(problems)


# --- static checks of what the pages name ---------------------------------------------------

def documented(check) -> list[str]:
    return [f"{page.relative_to(ROOT)}: {problem}" for page in PAGES if page != GENERATED
            for code in code_texts(page) for problem in check(code)]


@pytest.mark.quick
def test_documented_hpckit_commands_and_options_exist():
    problems = documented(lambda code: [problem for words in hpckit_invocations(code)
                                        for problem in cli_problems(words, main)])
    assert not problems, "\n".join(problems)


@pytest.mark.quick
def test_documented_environment_variables_are_read():
    names = {name for page in PAGES for code in code_texts(page) for name in ENV_NAME.findall(code)}
    assert not (unread := unread_env_names(names, package_text())), "\n".join(unread)


@pytest.mark.quick
def test_documented_python_names_import():
    names = {name for page in PAGES for code in code_texts(page) for name in python_names(code)}
    assert not (broken := [why for name in sorted(names) if (why := unresolved(name))]), "\n".join(broken)


@pytest.mark.quick
def test_documented_options_of_the_examples_exist():
    assert not (problems := documented(example_option_problems)), "\n".join(problems)


@pytest.mark.quick
def test_the_checkers_report_what_does_not_exist():
    """The checks above cannot pass by finding nothing: a page naming a command, an option, a
    variable and a name that do not exist is reported on each."""
    page = ("Run `hpckit stop EXP`, then `hpckit ls --no-such-option`, with `HPCKIT_NO_SUCH`\n"
            "```python\nfrom hpckit import NoSuchName\nhpckit.torch.no_such_function()\n```\n"
            "`python examples/linear.py --no-such-flag`\n")
    commands = [problem for words in hpckit_invocations(page) for problem in cli_problems(words, main)]
    assert commands[0].startswith("no command `hpckit stop`") and "ls" in commands[0]
    assert commands[1:] == ["no option `--no-such-option` of `hpckit ls`"]
    assert unread_env_names(set(ENV_NAME.findall(page)), package_text()) == \
        ["`HPCKIT_NO_SUCH` is read nowhere in hpckit/"]
    assert [unresolved(name) for name in sorted(python_names(page))] == [
        "`hpckit.NoSuchName`: hpckit has no `NoSuchName`",
        "`hpckit.torch.no_such_function`: hpckit.torch has no `no_such_function`"]
    assert example_option_problems(page) == ["examples/linear.py has no option --no-such-flag"]
    assert hpckit_invocations("hpckit run -n 2 train.py --epochs 3  # hpckit starts ranks") == \
        [["run", "-n", "2", "train.py", "--epochs", "3"]]
    assert cli_problems(["run", "-n", "2", "train.py", "--epochs", "3"], main) == []


# --- sbatch scripts -------------------------------------------------------------------------

def _job_scripts() -> list[tuple[str, str]]:
    scripts = [(block.id, block.text) for block in BLOCKS if block.is_sbatch]
    return scripts + [(str(path.relative_to(ROOT)), path.read_text())
                      for path in sorted((ROOT / "slurm").glob("*.sbatch"))]


@pytest.mark.quick
@pytest.mark.parametrize("script", [text for _, text in _job_scripts()], ids=[i for i, _ in _job_scripts()])
def test_job_scripts_warn_the_ranks_and_name_the_mpi(script):
    run(["bash", "-n", "-c", script], timeout=10)
    assert not (problems := sbatch_problems(script, cpu_only="examples/" in script)), "\n".join(problems)


@pytest.mark.quick
def test_the_sbatch_checker_finds_a_warning_that_kills_the_batch_shell():
    plain = "#!/bin/bash\n#SBATCH --signal=B:USR2@300\n#SBATCH --gres=gpu:4\nsrun python examples/linear.py\n"
    assert sbatch_problems(plain, cpu_only=True) == [
        "srun without --mpi= (the PMI of mpi4py's MPI; the templates ask hpckit doctor --srun-mpi): "
        "srun python examples/linear.py",
        "--signal=B:USR2 but no `trap ... USR2`: the warning kills the batch shell",
        "--signal=B:USR2 but the ranks are never sent USR2 (`kill -USR2` the backgrounded srun)",
        "srun runs in the foreground: the batch shell cannot trap the warning until it ends",
        "--gres=gpu:4 asks for GPUs for a CPU example"]
    driver = "#!/bin/bash\n#SBATCH --signal=B:USR2@120\nexport HPCKIT_STOP_SIGNAL=USR2\nexec python train.py\n"
    assert sbatch_problems(driver, cpu_only=False) == []  # the batch process is train.py itself
    assert sbatch_problems(driver.replace("exec ", ""), cpu_only=False) == [
        "--signal=B:USR2 but no `trap ... USR2`: the warning kills the batch shell"]


@pytest.mark.quick
@pytest.mark.parametrize("block", _of("json"), ids=lambda block: block.id)
def test_json_block_parses(block):
    assert parses_as_json(block.text), block.text


# --- blocks that run ------------------------------------------------------------------------

@pytest.mark.parametrize("block", _of("python"), ids=lambda block: block.id)
def test_python_block_runs(block, tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(_python_text(block))
    run([sys.executable, str(script)], timeout=120, cwd=tmp_path, env={**ENV, "HOME": str(tmp_path)})


COMMAND_ENDED = "@@@ the command ended @@@"
# The run docs/inspecting-results.md starts with, and the one every later block on the pages
# goes on from (the experiment /tmp/docrun/linear, ~/hpckit_results/linear in the harness).
TRAINING = "python examples/linear.py --workers 2 --storage /tmp/docrun --epochs 5"


def _command_script(command: str, status: int) -> str:
    command = command.replace("/tmp/docrun", "$HOME/docrun")
    return (f"{command}\ns=$?; [ $s -eq {status} ] || {{ echo \"exit status $s, the page "
            f"says {status}: {command}\"; exit 1; }}\necho '{COMMAND_ENDED}'\n")


def _starts_with_training(block: Block) -> bool:
    """Whether the block's first command is TRAINING, run in a home with nothing before it."""
    commands = shell_commands(block) or []
    return not (block.marker and block.marker[0] == "run with") and commands[:1] == [(TRAINING, 0)]


@pytest.fixture(scope="session")
def trained_home(tmp_path_factory) -> tuple[Path, str]:
    """A HOME whose ~/hpckit_results/linear (also $HOME/docrun/linear, as the pages'
    /tmp/docrun/linear) is the run TRAINING makes, as the page runs it, and what TRAINING
    printed; trained once a test run, by whichever worker needs it first (every test copies
    it before it runs a command, and a block that starts with TRAINING goes on from it)."""
    def train() -> list[str]:
        home = tmp_path_factory.mktemp("home")
        (home / "hpckit_results").mkdir()
        (home / "docrun").symlink_to("hpckit_results")
        (home / "examples").symlink_to(ROOT / "examples")
        out = run(["bash", "-c", _command_script(TRAINING, 0)], timeout=120, cwd=home,
                  env={**ENV, "HOME": str(home)})
        (home / "examples").unlink()
        return [str(home), out.output.split(COMMAND_ENDED + "\n")[0]]

    home, printed = computed_once(tmp_path_factory, "trained-home", train)
    return Path(home), printed


def _shell_script(block: Block) -> str:
    """The block's commands as a bash script, less a first TRAINING (the trained home is its
    run)."""
    kind, name = block.marker or ("", "")
    lines = [SHELL_COMPLETIONS[name]] if kind == "run with" else []
    commands = shell_commands(block) or []
    for command, status in commands[1:] if _starts_with_training(block) else commands:
        lines.append(_command_script(command, status))
    return "".join(lines)


@pytest.mark.parametrize("block", _of("shell"), ids=lambda block: block.id)
def test_shell_block_runs(block, trained_home, tmp_path):
    """Every command ends as the page says; in a console block, each prints what the page
    shows under it (unless the block is marked a sample)."""
    trained, training_printed = trained_home
    home = tmp_path / "home"
    shutil.copytree(trained, home, symlinks=True)
    (home / "examples").symlink_to(ROOT / "examples")
    out = run(["bash", "-c", _shell_script(block)], timeout=120, cwd=home,
              env={**ENV, "HOME": str(home)})
    if block.language != "console" or (block.marker and block.marker[0] == "sample"):
        return
    paths = {str(home / "docrun"): "/tmp/docrun", str(home / "hpckit_results"): "~/hpckit_results",
             str(home): "~"}
    printed = out.output.split(COMMAND_ENDED + "\n")
    if _starts_with_training(block):
        printed.insert(0, training_printed.replace(str(trained), str(home)))
    problems = [f"$ {command}\n{problem}" for (command, shown), said in zip(transcript(block), printed)
                if (problem := transcript_problem(normalised("\n".join(shown), {}),
                                                  normalised(said, paths))) is not None]
    assert not problems, f"{block.id}: " + "\n".join(problems)


@pytest.mark.quick
def test_the_trained_home_is_the_run_a_page_starts_with():
    """The trained home stands for a run the pages show, and a block going on from it runs
    every command after that run."""
    starting = [block for block in _of("shell") if _starts_with_training(block)]
    assert starting, f"no shell block starts with `{TRAINING}`, the run the trained home is"
    for block in starting:
        script = _shell_script(block)
        assert not script.startswith(TRAINING.split(" --")[0])
        assert script.count(COMMAND_ENDED) == len(shell_commands(block)) - 1


@pytest.mark.quick
def test_the_transcript_check_finds_a_column_the_command_no_longer_prints():
    """docs/inspecting-results.md once showed `hpckit show` with a SHA256 column after the
    command had moved to XXH3-128: what differs run to run is normalised, that is not."""
    page = "  FILE         SIZE  RANK  SHA256\n  model.pt  2.1 KiB     0  b5d9322595ce008e84b71eee\n"
    now = ("  FILE         SIZE  RANK  CHECKSUM\n"
           "  model.pt  2.1 KiB     0  xxh3-128:5e1f09ab77c0d2e3\n")
    problem = transcript_problem(normalised(page, {}), normalised(now, {}))
    assert problem and "SHA256" in problem and "CHECKSUM" in problem
    shown = normalised("/tmp/docrun/linear  step 9  2026-11-23 16:52:28  loss=0.000424575\n...\n"
                       "1 of 2 file(s)\n", {})
    printed = normalised("/home/u/docrun/linear step 9  2027-01-02 03:04:05  loss=0.00051\n"
                         "a\nb\n1 of 2 file(s)\n", {"/home/u/docrun": "/tmp/docrun"})
    assert transcript_problem(shown, printed) is None
    assert transcript_problem(shown, printed[:1]) is not None, "the line after ... is missing"
    many = ["..."] * 12 + ["the end"]
    assert transcript_problem(many, [f"line {i}" for i in range(25)]) is not None  # at once
    assert transcript_problem(many, [f"line {i}" for i in range(25)] + ["the end"]) is None
