//! Date parts of RFC 5260 §4.2 as the strings the `date` and `currentdate`
//! tests compare.

use chrono::{DateTime, Datelike, FixedOffset, NaiveDate, Timelike};

use crate::ast::{DatePart, Zone};

pub(crate) fn in_zone(t: DateTime<FixedOffset>, zone: Zone, local: FixedOffset) -> DateTime<FixedOffset> {
    match zone {
        Zone::Local => t.with_timezone(&local),
        Zone::Fixed(secs) => FixedOffset::east_opt(secs).map_or(t, |z| t.with_timezone(&z)),
        Zone::Original => t,
    }
}

pub(crate) fn part(t: &DateTime<FixedOffset>, part: DatePart) -> String {
    let offset = t.offset().local_minus_utc();
    let zone = format!(
        "{}{:02}{:02}",
        if offset < 0 { '-' } else { '+' },
        offset.abs() / 3600,
        offset.abs() % 3600 / 60
    );
    match part {
        DatePart::Year => format!("{:04}", t.year()),
        DatePart::Month => format!("{:02}", t.month()),
        DatePart::Day => format!("{:02}", t.day()),
        DatePart::Date => format!("{:04}-{:02}-{:02}", t.year(), t.month(), t.day()),
        DatePart::Julian => {
            // The Modified Julian Day: days since 1858-11-17.
            let epoch = NaiveDate::from_ymd_opt(1858, 11, 17).unwrap_or_default();
            (t.date_naive() - epoch).num_days().to_string()
        }
        DatePart::Hour => format!("{:02}", t.hour()),
        DatePart::Minute => format!("{:02}", t.minute()),
        DatePart::Second => format!("{:02}", t.second()),
        DatePart::Time => format!("{:02}:{:02}:{:02}", t.hour(), t.minute(), t.second()),
        DatePart::Iso8601 => t.format("%Y-%m-%dT%H:%M:%S%:z").to_string(),
        DatePart::Std11 => t.format("%a, %d %b %Y %H:%M:%S %z").to_string(),
        DatePart::Zone => zone,
        DatePart::Weekday => t.weekday().num_days_from_sunday().to_string(),
    }
}
