#!/bin/sh
# Render each manual page given as an argument and fail when rendering fails
# or prints anything on stderr (groff warnings included).
# Exit 77 (skipped) when no page is given (scdoc was not found at configure
# time) or when neither man nor groff is installed.
if [ $# -eq 0 ]; then
    echo "render-check: no manual pages were built (scdoc not found?)" >&2
    exit 77
fi
if man --version >/dev/null 2>&1; then
    render() { MANWIDTH=80 man --warnings=w -E UTF-8 -l "$1"; }
elif command -v groff >/dev/null 2>&1; then
    render() { groff -man -Tutf8 -ww "$1"; }
else
    echo "render-check: neither man nor groff is installed" >&2
    exit 77
fi
err=$(mktemp) || exit 1
trap 'rm -f "$err"' EXIT
status=0
for page in "$@"; do
    if [ ! -s "$page" ]; then
        echo "FAIL $page: missing or empty" >&2
        status=1
        continue
    fi
    if ! render "$page" >/dev/null 2>"$err"; then
        echo "FAIL $page: rendering failed" >&2
        cat "$err" >&2
        status=1
    elif [ -s "$err" ]; then
        echo "FAIL $page: warnings while rendering" >&2
        cat "$err" >&2
        status=1
    else
        echo "ok   $page"
    fi
done
exit $status
