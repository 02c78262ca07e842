//! `strftime_now(fmt)`: the date some templates print into the system turn
//! (Llama 3.2: "Today Date: 26 Jul 2024").
//!
//! A hand-written subset of C `strftime` in the C locale, in UTC, rather than
//! a date-time dependency: templates use a handful of directives
//! (`%Y-%m-%d`, `%d %b %Y`, `%B %d, %Y`), and an unknown one is an error, not
//! a silently different string.

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A UTC calendar time broken into fields.
struct Civil {
    year: i64,
    month: u32, // 1..=12
    day: u32,   // 1..=31
    hour: u32,
    minute: u32,
    second: u32,
    weekday: usize, // 0 = Monday
    yday: u32,      // 1..=366
}

/// Days since 1970-01-01 → (year, month, day); Howard Hinnant's
/// `civil_from_days`, exact over the whole proleptic Gregorian calendar.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn civil(unix: i64) -> Civil {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400) as u32;
    let (year, month, day) = civil_from_days(days);
    const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUM[month as usize - 1] + day + u32::from(month > 2 && is_leap(year));
    Civil {
        year,
        month,
        day,
        hour: secs / 3600,
        minute: secs / 60 % 60,
        second: secs % 60,
        // 1970-01-01 was a Thursday (index 3).
        weekday: (days + 3).rem_euclid(7) as usize,
        yday,
    }
}

/// Formats `unix` (seconds since the epoch, UTC) by `fmt`. `%-d`-style
/// (no padding) is accepted as glibc does. Errors name the directive.
pub(crate) fn strftime(fmt: &str, unix: i64) -> Result<String, String> {
    let t = civil(unix);
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut d = chars
            .next()
            .ok_or("strftime_now: format ends with a lone %")?;
        let pad = d != '-';
        if !pad {
            d = chars.next().ok_or("strftime_now: format ends with %-")?;
        }
        let num = |n: i64, width: usize| {
            if pad {
                format!("{n:0width$}")
            } else {
                n.to_string()
            }
        };
        let hour12 = if t.hour.is_multiple_of(12) {
            12
        } else {
            t.hour % 12
        };
        let s = match d {
            'Y' => t.year.to_string(),
            'y' => num(t.year.rem_euclid(100), 2),
            'm' => num(t.month.into(), 2),
            'd' => num(t.day.into(), 2),
            'e' => format!("{:>2}", t.day),
            'H' => num(t.hour.into(), 2),
            'I' => num(hour12.into(), 2),
            'M' => num(t.minute.into(), 2),
            'S' => num(t.second.into(), 2),
            'j' => num(t.yday.into(), 3),
            'p' => if t.hour < 12 { "AM" } else { "PM" }.to_string(),
            'b' | 'h' => MONTHS[t.month as usize - 1][..3].to_string(),
            'B' => MONTHS[t.month as usize - 1].to_string(),
            'a' => DAYS[t.weekday][..3].to_string(),
            'A' => DAYS[t.weekday].to_string(),
            'u' => (t.weekday + 1).to_string(),
            'w' => ((t.weekday + 1) % 7).to_string(),
            'Z' => "UTC".to_string(),
            'z' => "+0000".to_string(),
            '%' => "%".to_string(),
            other => return Err(format!("strftime_now: unsupported directive %{other}")),
        };
        out.push_str(&s);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::strftime;

    // Expected strings from Python: datetime.fromtimestamp(t, timezone.utc).strftime(fmt).
    #[test]
    fn strftime_matches_python_for_the_directives_templates_use() {
        let t = 1_721_952_000 + 13 * 3600 + 5 * 60 + 9; // 2024-07-26 13:05:09 UTC
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "26 Jul 2024");
        assert_eq!(strftime("%Y-%m-%d", t).unwrap(), "2024-07-26");
        assert_eq!(strftime("%B %d, %Y", t).unwrap(), "July 26, 2024");
        assert_eq!(
            strftime("%A %a %H:%M:%S %I%p %j %y %%", t).unwrap(),
            "Friday Fri 13:05:09 01PM 208 24 %"
        );
        // 2000-02-29 (a leap day in a century leap year), 1969-12-31 (before the epoch).
        assert_eq!(
            strftime("%Y-%m-%d %j %a", 951_782_400).unwrap(),
            "2000-02-29 060 Tue"
        );
        assert_eq!(
            strftime("%Y-%m-%d %H:%M %A", -60).unwrap(),
            "1969-12-31 23:59 Wednesday"
        );
        assert_eq!(strftime("%-d/%-m", 1_704_067_200).unwrap(), "1/1");
    }

    #[test]
    fn an_unknown_strftime_directive_is_an_error_naming_it() {
        let e = strftime("%Q", 0).unwrap_err();
        assert!(e.contains("%Q"), "{e}");
        assert!(strftime("50%", 0).is_err());
    }
}
