# Hooks for scripts/schemathesis.sh.
#
# POST /fraud/history/generate may rightly take minutes and gigabytes (the case study's 30 M cards take
# most of this machine's memory), so a run of a few examples per operation could spend its time there.
# A valid size is made small and stays valid: the handler's checks of range and type still meet every
# generated value, and invalid bodies reach it unchanged.
import schemathesis

GENERATE_PATH = "/fraud/history/generate"
CARDS_MAX = 100
LENGTH_MAX = 50


def _valid(value, low, high):
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


@schemathesis.hook
def before_call(ctx, case, kwargs):
    if case.operation.path != GENERATE_PATH or not isinstance(case.body, dict):
        return
    body = case.body
    if _valid(body.get("cards"), 1, 2**31 - 1) and body["cards"] > CARDS_MAX:
        body["cards"] = 1 + body["cards"] % CARDS_MAX
    if _valid(body.get("length"), 0, 1000) and body["length"] > LENGTH_MAX:
        body["length"] = body["length"] % LENGTH_MAX
