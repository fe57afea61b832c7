import pytest

from harness.reward import correct, score


@pytest.mark.parametrize(
    "response, answer, expected",
    [
        ("82", "82", 1.0),
        (" 82 ", "82", 1.0),  # surrounding whitespace is not part of the number
        ("83", "82", 0.5),  # tens right, units wrong
        ("182", "82", 2 / 3),  # an extra leading digit costs a place
        ("2", "82", 0.5),  # units right, tens missing
        ("28", "82", 0.0),  # same digits, wrong places
        ("", "82", 0.0),
        ("8 2", "82", 0.0),
        ("-82", "82", 0.0),
        ("８２", "82", 0.0),  # full-width digits are not ASCII digits
        ("0", "0", 1.0),
    ],
)
def test_score_gives_place_wise_partial_credit(response, answer, expected):
    assert score("40+42=", response, answer) == pytest.approx(expected)


def test_score_cannot_be_earned_by_a_constant_guess():
    # Over all sums of two 2-digit numbers, the best single constant earns far less than solving the task.
    answers = [str(a + b) for a in range(100) for b in range(100)]
    best_constant = max(sum(score("", str(c), a) for a in answers) / len(answers) for c in range(199))
    assert best_constant < 0.5


def test_correct_is_exact_match():
    assert correct(" 82", "82") and not correct("820", "82")
