#!/bin/sh
# The feature table's rule (runtime/features.h): a feature's state is its file's own. For each
# row's file and the part of struct dear_ctx it keeps, no other file of the library reads or
# writes that part (it asks the file's narrow functions in rt.h instead); every row of the table
# is defined in exactly one file; and every row but the memory's has its name in the combination
# test (tests/mpi/test_combo.c).
set -u
: "${top_srcdir:=.}"
cd "$top_srcdir" || exit 99
fail=0
bad() { echo "features.sh: $*" >&2; fail=1; }

# file:field of struct dear_ctx that file owns
for pair in shard.c:shard clip.c:clip unused.c:unused sparse.c:sparse compress.c:comp determ.c:determ \
    partition.c:part; do
    file=runtime/${pair%%:*} field=${pair#*:}
    [ -f "$file" ] || { bad "$file: no such file"; continue; }
    for f in runtime/*.c runtime/*.h cuda/*.c apps/tools/*.c; do
        [ -f "$f" ] && [ "$f" != "$file" ] || continue
        if grep -nE "(ctx|c)->$field\.|&ctx->$field\b" "$f" >/dev/null; then
            bad "$f reaches into $file's state (ctx->$field): ask a narrow function of $file instead"
            grep -nE "(ctx|c)->$field\.|&ctx->$field\b" "$f" | head -3 >&2
        fi
    done
done

rows=$(sed -n 's/^ *X([A-Z_]*, "\([a-z]*\)", \(dear_feature_[a-z]*\),.*/\1:\2/p' runtime/features.h)
[ -n "$rows" ] || bad "no rows read from runtime/features.h"
for r in $rows; do
    name=${r%%:*} row=${r#*:}
    n=$(grep -l "^const dear_feature_t $row = {" runtime/*.c | wc -l)
    [ "$n" -eq 1 ] || bad "row $row is defined in $n file(s) of runtime/, not one"
    [ "$name" = cuda ] && continue   # the memory kind: the GPU tests and the combination's memory dimension
    grep -q "\"$name\"" tests/mpi/test_combo.c || bad "feature '$name' has no line in tests/mpi/test_combo.c"
done
[ $fail -eq 0 ] && echo "features.sh: $(echo "$rows" | wc -w) rows, each one file, state private"
exit $fail
