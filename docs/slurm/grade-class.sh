#!/usr/bin/env bash
# Grade a class on Slurm: one job array grades the class in N slices, side by side, and a merge
# job, which starts once every slice has succeeded, joins the slices' reports into one.
#
#   docs/slurm/grade-class.sh SUBMITTED N [OUT]
#
# Run it on a login node, from the repository root, with the repository and the lab's virtual
# environment on a file system that the compute nodes share. The jobs run in the repository
# root, with the environment of the shell that submits them (sbatch's default).
#
#   SUBMITTED  the folder of students' folders, such as nbgrader's submitted/
#   N          how many slices (array tasks): task I runs
#                python -m grader grade SUBMITTED --shard I/N --json OUT/slice-I.json
#              with --jobs set to the CPUs Slurm gave the task (SLURM_CPUS_PER_TASK)
#   OUT        where the reports and the jobs' logs go (default: graded); the merge job writes
#              OUT/results.json, OUT/grades.csv and OUT/gradescope/<student>/results.json
#
# Settings, as environment variables (default in brackets):
#   PYTHON         the lab's Python, a path or a command on the nodes' PATH [.venv/bin/python]
#   PARTITION      the partition of both jobs [Slurm's default partition]
#   CPUS_PER_TASK  CPUs of each slice's task; it grades that many submissions at a time [4]
#   MEM            memory of each slice's task, as sbatch's --mem takes it [8G]
#   TIME_LIMIT     time limit of each slice's task, as sbatch's --time takes it [2:00:00]
#   MERGE_MEM      memory of the merge job (one CPU, TIME_LIMIT) [2G]
#   SBATCH_ARGS    more sbatch options for both jobs, split at spaces, such as
#                  "--account=course --qos=normal" []
#   GRADE_ARGS     more options of `python -m grader grade`, split at spaces, such as
#                  "--seed 7 -e allreduce -e split_batch" []
#   MERGE_ARGS     more options of `python -m grader merge`, such as "--feedback OUT/feedback" []
#
# A slice's report is kept: run the script again with the same N and OUT and each task grades
# only what changed (`grade --json` does not grade a submission already in its report again).
# Progress: squeue -u "$USER"; a task's log is OUT/slice-I.log, the merge's OUT/merge.log.
# If a slice fails, Slurm cancels the merge job (--kill-on-invalid-dep=yes).

set -euo pipefail

usage() {
    cat >&2 <<'EOF'
usage: docs/slurm/grade-class.sh SUBMITTED N [OUT]
  SUBMITTED  an existing folder of students' folders (such as nbgrader's submitted/)
  N          how many slices of the class to grade side by side: a whole number, 1 or more
  OUT        where the slices' reports, the merged results and the logs go (default: graded)
Settings: PYTHON PARTITION CPUS_PER_TASK MEM TIME_LIMIT MERGE_MEM SBATCH_ARGS GRADE_ARGS
MERGE_ARGS (see the top of the script).
EOF
}

fail() {
    echo "grade-class.sh: error: $*" >&2
    usage
    exit 2
}

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    usage
    exit 0
fi
[[ $# -ge 2 && $# -le 3 ]] || fail "give SUBMITTED and N, and OUT if you like"
submitted=$1
count=$2
out=${3:-graded}
[[ -d $submitted ]] || fail "$submitted is not a folder"
[[ $count =~ ^[0-9]+$ ]] && ((10#$count >= 1)) || fail "N must be a whole number, 1 or more, not '$count'"
count=$((10#$count))

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-$repo/.venv/bin/python}
PARTITION=${PARTITION:-}
CPUS_PER_TASK=${CPUS_PER_TASK:-4}
MEM=${MEM:-8G}
TIME_LIMIT=${TIME_LIMIT:-2:00:00}
MERGE_MEM=${MERGE_MEM:-2G}
read -r -a sbatch_args <<<"${SBATCH_ARGS:-}"
read -r -a grade_args <<<"${GRADE_ARGS:-}"
read -r -a merge_args <<<"${MERGE_ARGS:-}"

[[ $CPUS_PER_TASK =~ ^[1-9][0-9]*$ ]] || fail "CPUS_PER_TASK must be a whole number, 1 or more"
command -v sbatch >/dev/null || fail "no sbatch here: run this on a Slurm login node"
if [[ $PYTHON == */* ]]; then
    [[ -x $PYTHON ]] || fail "PYTHON=$PYTHON is not a program: make the lab's .venv, or set PYTHON"
    python=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")
else
    command -v "$PYTHON" >/dev/null || fail "PYTHON=$PYTHON: no such command here"
    python=$PYTHON
fi

# The jobs get absolute paths: they run in the repository root, not where this was called.
submitted=$(cd "$submitted" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)

common=(--parsable --chdir="$repo" "${sbatch_args[@]}")
if [[ -n $PARTITION ]]; then common+=(--partition="$PARTITION"); fi

# The jobs' scripts, every path and option quoted as the shell reads it back.
q() { if (($#)); then printf '%q ' "$@"; fi; }
slice_script="#!/usr/bin/env bash
set -euo pipefail
i=\$SLURM_ARRAY_TASK_ID out=$(printf %q "$out")
exec $(q "$python") -m grader grade $(q "$submitted") --shard \"\$i/$count\" \\
    --jobs \"\${SLURM_CPUS_PER_TASK:-1}\" --json \"\$out/slice-\$i.json\" $(q "${grade_args[@]}")
"
slices=()
for ((i = 0; i < count; i++)); do slices+=("$out/slice-$i.json"); done
merge_script="#!/usr/bin/env bash
set -euo pipefail
exec $(q "$python") -m grader merge $(q "${slices[@]}") --json $(q "$out/results.json") \\
    --csv $(q "$out/grades.csv") --gradescope $(q "$out/gradescope") $(q "${merge_args[@]}")
"

array=$(sbatch "${common[@]}" --job-name=grade-slice --array="0-$((count - 1))" \
    --cpus-per-task="$CPUS_PER_TASK" --mem="$MEM" --time="$TIME_LIMIT" \
    --output="$out/slice-%a.log" <<<"$slice_script")
array=${array%%;*} # --parsable prints "id" or "id;cluster"
merge=$(sbatch "${common[@]}" --job-name=grade-merge --dependency="afterok:$array" \
    --kill-on-invalid-dep=yes --cpus-per-task=1 --mem="$MERGE_MEM" --time="$TIME_LIMIT" \
    --output="$out/merge.log" <<<"$merge_script") || {
    echo "grade-class.sh: the merge job was not submitted, but the job array $array was:" \
        "once it has ended, merge by hand:" >&2
    tail -n 2 <<<"$merge_script" >&2
    exit 1
}
merge=${merge%%;*}

echo "grading job array: $array ($count tasks; task I logs to $out/slice-I.log)"
echo "merge job: $merge (starts when every task has succeeded; logs to $out/merge.log)"
echo "results: $out/results.json, $out/grades.csv, $out/gradescope/"
echo "progress: squeue -j $array,$merge"
