"""Hand-written schedule tables of debate and MNIP (same schedules, 8 rounds).

Each table is ``[round][agent: prover0, prover1, verifier][channel: prover0_channel,
prover1_channel]``.
"""

SIMULTANEOUS_VERIFIER_FIRST = [
    [[0, 0], [0, 0], [1, 1]],  # 0 verifier (both channels)
    [[1, 0], [0, 1], [0, 0]],  # 1 both provers, each in its own channel
    [[0, 0], [0, 0], [1, 1]],  # 2 verifier
    [[1, 0], [0, 1], [0, 0]],  # 3 provers
    [[0, 0], [0, 0], [1, 1]],  # 4 verifier
    [[1, 0], [0, 1], [0, 0]],  # 5 provers
    [[0, 0], [0, 0], [1, 1]],  # 6 verifier
    [[1, 0], [0, 1], [0, 0]],  # 7 provers
]
SIMULTANEOUS_PROVERS_FIRST = [
    [[1, 0], [0, 1], [0, 0]],  # 0 provers
    [[0, 0], [0, 0], [1, 1]],  # 1 verifier
    [[1, 0], [0, 1], [0, 0]],  # 2 provers
    [[0, 0], [0, 0], [1, 1]],  # 3 verifier
    [[1, 0], [0, 1], [0, 0]],  # 4 provers
    [[0, 0], [0, 0], [1, 1]],  # 5 verifier
    [[1, 0], [0, 1], [0, 0]],  # 6 provers
    [[0, 0], [0, 0], [1, 1]],  # 7 verifier
]
SEQUENTIAL_VERIFIER_FIRST_PROVER0_FIRST = [
    [[0, 0], [0, 0], [1, 1]],  # 0 verifier
    [[1, 0], [0, 0], [0, 0]],  # 1 prover0
    [[0, 0], [0, 1], [0, 0]],  # 2 prover1
    [[0, 0], [0, 0], [1, 1]],  # 3 verifier
    [[1, 0], [0, 0], [0, 0]],  # 4 prover0
    [[0, 0], [0, 1], [0, 0]],  # 5 prover1
    [[0, 0], [0, 0], [1, 1]],  # 6 verifier
    [[1, 0], [0, 0], [0, 0]],  # 7 prover0
]
SEQUENTIAL_VERIFIER_FIRST_PROVER1_FIRST = [
    [[0, 0], [0, 0], [1, 1]],  # 0 verifier
    [[0, 0], [0, 1], [0, 0]],  # 1 prover1
    [[1, 0], [0, 0], [0, 0]],  # 2 prover0
    [[0, 0], [0, 0], [1, 1]],  # 3 verifier
    [[0, 0], [0, 1], [0, 0]],  # 4 prover1
    [[1, 0], [0, 0], [0, 0]],  # 5 prover0
    [[0, 0], [0, 0], [1, 1]],  # 6 verifier
    [[0, 0], [0, 1], [0, 0]],  # 7 prover1
]
SEQUENTIAL_PROVERS_FIRST_PROVER0_FIRST = [
    [[1, 0], [0, 0], [0, 0]],  # 0 prover0
    [[0, 0], [0, 1], [0, 0]],  # 1 prover1
    [[0, 0], [0, 0], [1, 1]],  # 2 verifier
    [[1, 0], [0, 0], [0, 0]],  # 3 prover0
    [[0, 0], [0, 1], [0, 0]],  # 4 prover1
    [[0, 0], [0, 0], [1, 1]],  # 5 verifier
    [[1, 0], [0, 0], [0, 0]],  # 6 prover0
    [[0, 0], [0, 1], [0, 0]],  # 7 prover1
]
SEQUENTIAL_PROVERS_FIRST_PROVER1_FIRST = [
    [[0, 0], [0, 1], [0, 0]],  # 0 prover1
    [[1, 0], [0, 0], [0, 0]],  # 1 prover0
    [[0, 0], [0, 0], [1, 1]],  # 2 verifier
    [[0, 0], [0, 1], [0, 0]],  # 3 prover1
    [[1, 0], [0, 0], [0, 0]],  # 4 prover0
    [[0, 0], [0, 0], [1, 1]],  # 5 verifier
    [[0, 0], [0, 1], [0, 0]],  # 6 prover1
    [[1, 0], [0, 0], [0, 0]],  # 7 prover0
]

# (verifier_first, sequential, prover0_first, table, verifier questions, first active rounds)
VARIANTS = [
    (True, False, True, SIMULTANEOUS_VERIFIER_FIRST, 4, {"prover0": 1, "prover1": 1, "verifier": 0}),
    # prover0_first has no effect on the simultaneous schedule
    (True, False, False, SIMULTANEOUS_VERIFIER_FIRST, 4, {"prover0": 1, "prover1": 1, "verifier": 0}),
    (False, False, True, SIMULTANEOUS_PROVERS_FIRST, 4, {"prover0": 0, "prover1": 0, "verifier": 1}),
    (True, True, True, SEQUENTIAL_VERIFIER_FIRST_PROVER0_FIRST, 3,
     {"prover0": 1, "prover1": 2, "verifier": 0}),
    (True, True, False, SEQUENTIAL_VERIFIER_FIRST_PROVER1_FIRST, 3,
     {"prover0": 2, "prover1": 1, "verifier": 0}),
    (False, True, True, SEQUENTIAL_PROVERS_FIRST_PROVER0_FIRST, 2,
     {"prover0": 0, "prover1": 1, "verifier": 2}),
    (False, True, False, SEQUENTIAL_PROVERS_FIRST_PROVER1_FIRST, 2,
     {"prover0": 1, "prover1": 0, "verifier": 2}),
]
