#!/usr/bin/env bash
# Mutation testing with mutmut 3: each target file is mutated alone and judged by its own fast tests, in a
# scratch copy of the repository (the working tree is never touched). docs/TESTING.md records the scores.
#
#   scripts/mutation.sh                      every target, one after another
#   scripts/mutation.sh harness/metrics.py   only the named targets
#
# Results: $MUTATION_DIR/<target>/summary.json (mutmut's counts) and survivors.txt; MUTATION_DIR defaults
# to /tmp/mutation. MUTATION_JOBS (default 2) sets mutmut's parallel children.
set -euo pipefail -o noglob  # pytest node ids hold [brackets]

# Target file -> the tests that should kill its mutants (fast ones only: every mutant reruns them).
declare -A TESTS=(
  [harness/metrics.py]="tests/test_metrics.py"
  [analysis/stats.py]="tests/test_stats.py"
  [analysis/claims.py]="tests/test_stats.py tests/test_claims.py
    tests/test_adaptive.py::test_a_claim_is_decided_at_its_first_decisive_look_and_only_open_claims_want_seeds
    tests/test_adaptive.py::test_a_running_look_gives_a_provisional_verdict_and_wants_nothing
    tests/test_adaptive.py::test_a_list_of_seeds_is_one_look_at_95_percent
    tests/test_adaptive.py::test_a_claim_whose_first_look_is_not_queued_yet_is_running_and_wants_nothing
    tests/test_adaptive.py::test_a_decided_claim_keeps_its_look_when_its_variants_run_on_for_another_claim
    tests/test_adaptive.py::test_seeds_wanted_takes_the_most_any_open_claim_wants_and_skips_a_claim_without_a_side"
  [models/rnn.py]="tests/test_reference_rnn.py tests/test_rnn.py"
  [models/positional.py]="tests/test_reference_attention.py tests/test_positional.py"
  [models/positional_layers.py]="tests/test_reference_attention.py tests/test_positional.py"
  [models/scores.py]="tests/test_reference_rnn.py tests/test_rnn.py tests/test_positional.py"
  [models/sequences.py]="tests/test_metrics.py tests/test_decoding.py"
  [models/optim.py]="tests/test_module.py tests/test_plumbing.py"
  [models/attention.py]="tests/test_reference_attention.py tests/test_reference_rnn.py"
  [models/transformer.py]="tests/test_reference_attention.py tests/test_transformer.py"
  [models/decoding.py]="tests/test_decoding.py"
  [models/module.py]="tests/test_module.py tests/test_plumbing.py"
  [models/config.py]="tests/test_config.py tests/test_plumbing.py"
  [models/diagnostics.py]="tests/test_transformer.py"
)
# Slow tests a target's mutants skip (pytest node ids): they cost minutes per run and test nothing the rest miss.
declare -A DESELECT=(
  [analysis/claims.py]="tests/test_claims.py::test_the_report_prints_each_claims_source_beside_its_verdict"
  [models/module.py]="tests/test_module.py::test_cpu_peak_memory_is_each_trials_own
    tests/test_module.py::test_compile_keeps_checkpoint_names tests/test_module.py::test_budgets_and_early_stopping
    tests/test_module.py::test_progress_bar_counts_epochs_without_a_negative_last_one
    tests/test_plumbing.py::test_key_reaches_its_user[train.keep_checkpoints]
    tests/test_plumbing.py::test_key_reaches_its_user[train.checkpoint_every]"
)
ORDER=(harness/metrics.py analysis/stats.py analysis/claims.py models/rnn.py models/scores.py
       models/positional.py models/positional_layers.py models/attention.py models/transformer.py
       models/decoding.py models/sequences.py models/module.py models/optim.py models/config.py
       models/diagnostics.py)

repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
out=${MUTATION_DIR:-/tmp/mutation}
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${ORDER[@]}")

for target in "${targets[@]}"; do
  tests=${TESTS[$target]:-}
  [ -n "$tests" ] || { echo "mutation.sh: no tests listed for $target (known: ${ORDER[*]})" >&2; exit 2; }
  work="$out/${target//\//_}"
  rm -rf "$work" && mkdir -p "$work/repo"
  # Tracked and new files, as the working tree has them.
  git -C "$repo" ls-files -co --exclude-standard -z | (cd "$repo" && xargs -0 cp --parents -t "$work/repo")
  {
    echo; echo "[tool.mutmut]"
    echo 'source_paths = ["ablate", "models", "harness", "analysis", "reports", "ablations", "bench"]'
    echo "only_mutate = [\"$target\"]"
    printf 'pytest_add_cli_args_test_selection = [%s]\n' "$(printf '"%s", ' $tests)"
    deselect=""
    for node in ${DESELECT[$target]:-}; do deselect+=", \"--deselect=$node\""; done
    echo "pytest_add_cli_args = [\"-p\", \"no:cacheprovider\", \"-q\"$deselect]"
    echo 'process_isolation = "forkserver"'  # torch is not fork-safe once its thread pools exist
  } >> "$work/repo/pyproject.toml"
  echo "== $target ($tests)"
  start=$(date +%s)
  (cd "$work/repo" && OMP_NUM_THREADS=1 mutmut run --max-children "${MUTATION_JOBS:-2}" > "$work/run.log" 2>&1) || true
  (cd "$work/repo" && mutmut export-cicd-stats > /dev/null && cp mutants/mutmut-cicd-stats.json "$work/summary.json")
  (cd "$work/repo" && mutmut results > "$work/survivors.txt")
  echo "   $(tr -d ' \n' < "$work/summary.json") in $(( $(date +%s) - start ))s; survivors: $work/survivors.txt"
done
