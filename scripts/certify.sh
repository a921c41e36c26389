#!/usr/bin/env bash
# Float32 losslessness certificates, one real run per method and task: every output must equal greedy decoding
# token for token (lossless_rate 1.0). Results: results/certificates/<task>-<method>/ and a table of all of them in
# results/certificates/summary.md. Methods whose artefact is not trained here are skipped with a note (neural
# rescorers take 15 min each: `bpdbench train-rescorer neural --size s|m|l`).
# Override: METHODS="bpd pld" TASKS="xsum" LIMIT=10 NEW=32 THREADS=1 bash scripts/certify.sh
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BPDBENCH:-.venv/bin/bpdbench}
LIMIT=${LIMIT:-5}
NEW=${NEW:-16}
THREADS=${THREADS:-2}
TASKS=${TASKS:-"xsum squad"}
METHODS=${METHODS:-"bpd bpd:threshold=0.4 ngram2 ngram4 16best-0gram 16best-ngram4 medusa medusa:tree=auto oracle:k=16 pld cascade hierarchy neural-s neural-m neural-l medusa-neural-m"}
OUT=${OUT:-results/certificates}
for t in $TASKS; do
  for m in $METHODS; do
    dir="$OUT/$t-$(echo "$m" | tr ':,=' '---')"
    $B run --task "$t" --method "$m" --limit "$LIMIT" --dtype float32 --max-new-tokens "$NEW" --threads "$THREADS" \
      --no-auto-train --out "$dir" --resume || echo "skipped $t $m (see the error above)"
  done
done
.venv/bin/python - "$OUT" <<'PY'
import sys, pathlib, pandas as pd
from bpdbench.report.summary import to_markdown
root = pathlib.Path(sys.argv[1])
rows = [pd.read_csv(p) for p in sorted(root.glob("*/summary.csv"))]
df = pd.concat(rows)[["task", "method", "dtype", "n_examples", "new_tokens", "block_efficiency", "lossless_rate"]]
(root / "summary.md").write_text("# float32 certificates (scripts/certify.sh)\n\n" + to_markdown(df))
print(to_markdown(df))
PY
