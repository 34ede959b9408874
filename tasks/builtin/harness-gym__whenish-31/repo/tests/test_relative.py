from datetime import date, datetime

from whenish import days_between, describe


def test_same_day_is_today():
    assert describe(date(2024, 5, 10), today=date(2024, 5, 10)) == "today"


def test_days_within_a_month():
    assert days_between(date(2024, 5, 10), date(2024, 5, 13)) == 3
    assert describe(date(2024, 5, 9), today=date(2024, 5, 10)) == "yesterday"


def test_datetimes_count_calendar_days():
    assert describe(datetime(2024, 5, 11, 0, 1), today=datetime(2024, 5, 10, 23, 59)) == "tomorrow"
