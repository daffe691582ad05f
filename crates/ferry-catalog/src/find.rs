//! `find`: objects by metadata, name, age and size, answered from the indexes.
//!
//! A query is put together from fixed SQL fragments, one per condition given, and every value
//! is a bound parameter: nothing a caller sends becomes SQL text. Each fragment has an index
//! behind it (path range, metadata by attribute and value or number, mtime, size), so that a
//! find with any of them never scans the whole table; a name glob alone is matched while
//! reading the rows.

use crate::db::{Db, Val};
use crate::store::{object_at, size_i64};
use crate::{bounded, under, Catalog, CatalogError, Object, MAX_ATTR, MAX_VALUE};

/// One metadata condition: `ATTR=VALUE`, `ATTR>N` or `ATTR<N`.
#[derive(Clone, Debug, PartialEq)]
pub enum Condition {
    Eq { attr: String, value: String },
    Gt { attr: String, n: f64 },
    Lt { attr: String, n: f64 },
}

impl Condition {
    /// Reads `ATTR=VALUE`, `ATTR>N` or `ATTR<N`: the first `=`, `>` or `<` splits it.
    pub fn parse(s: &str) -> Result<Self, CatalogError> {
        let bad = |why| CatalogError::BadCondition(s.to_owned(), why);
        let at = s
            .find(['=', '>', '<'])
            .ok_or_else(|| bad("no `=`, `>` or `<`"))?;
        let (attr, rest) = s.split_at(at);
        let (op, value) = rest.split_at(1);
        if attr.is_empty() {
            return Err(bad("no attribute before the operator"));
        }
        bounded("attribute", attr, MAX_ATTR, false)?;
        bounded("value", value, MAX_VALUE, true)?;
        let attr = attr.to_owned();
        let number = || {
            value
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite())
                .ok_or_else(|| bad("`>` and `<` compare with a number"))
        };
        Ok(match op {
            "=" => Self::Eq {
                attr,
                value: value.to_owned(),
            },
            ">" => Self::Gt { attr, n: number()? },
            _ => Self::Lt { attr, n: number()? },
        })
    }
}

/// What `find` looks for; every part given must hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Query {
    /// Only objects under this directory (empty or `None`: the whole catalog).
    pub under: Option<String>,
    pub conditions: Vec<Condition>,
    /// A glob over the object's name (its last path component): `*` any run, `?` one
    /// character.
    pub name: Option<String>,
    /// Only objects whose mtime is later than this (ns since the epoch).
    pub newer_ns: Option<i64>,
    /// Only objects larger than this many bytes.
    pub larger: Option<u64>,
    /// At most this many objects (0: no limit).
    pub limit: usize,
}

impl Catalog {
    /// The objects `query` matches, in path order.
    pub fn find(&self, query: &Query) -> Result<Vec<Object>, CatalogError> {
        let (sql, params) = compose(query);
        let args: Vec<_> = params.iter().map(Val::as_arg).collect();
        self.settled();
        let rows = self.lock().rows_planned(&sql, &args)?;
        let mut found = Vec::new();
        for mut row in rows {
            let o = object_at(&mut row, 0)?;
            if let Some(glob) = &query.name {
                let name = o.path.rsplit('/').next().unwrap_or(&o.path);
                if !glob_match(glob, name) {
                    continue;
                }
            }
            found.push(o);
            if found.len() == query.limit {
                break;
            }
        }
        Ok(found)
    }
}

/// The statement for `query`, from fixed fragments only (and the numbers of their
/// parameters), and its parameters.
fn compose(query: &Query) -> (String, Vec<Val>) {
    let mut sql = String::from(
        "SELECT path, size, mtime_ns, digest, algo, stored_by, stored_at FROM objects WHERE 1 = 1",
    );
    let mut params = Vec::new();
    if let Some(prefix) = query.under.as_deref().filter(|p| !p.is_empty()) {
        let (lo, hi) = under(prefix);
        sql.push_str(" AND path >= ? AND path < ?");
        params.extend([Val::Text(lo), Val::Text(hi)]);
    }
    if let Some(t) = query.newer_ns {
        sql.push_str(" AND mtime_ns > ?");
        params.push(Val::Int(t));
    }
    if let Some(n) = query.larger {
        sql.push_str(" AND size > ?");
        params.push(Val::Int(size_i64(n)));
    }
    for c in &query.conditions {
        let (fragment, attr, value) = match c {
            Condition::Eq { attr, value } => (
                " AND id IN (SELECT object FROM metadata WHERE attr = ? AND value = ?)",
                attr,
                Val::Text(value.clone()),
            ),
            Condition::Gt { attr, n } => (
                " AND id IN (SELECT object FROM metadata WHERE attr = ? AND num > ?)",
                attr,
                Val::Real(*n),
            ),
            Condition::Lt { attr, n } => (
                " AND id IN (SELECT object FROM metadata WHERE attr = ? AND num < ?)",
                attr,
                Val::Real(*n),
            ),
        };
        sql.push_str(fragment);
        params.extend([Val::Text(attr.clone()), value]);
    }
    // `+path`: the order never makes the planner walk the whole path index instead of the
    // index of a condition.
    sql.push_str(" ORDER BY +path");
    // A name glob is matched while reading, so only without one does the database stop early.
    if query.name.is_none() && query.limit > 0 {
        sql.push_str(" LIMIT ?");
        params.push(Val::Int(size_i64(query.limit as u64)));
    }
    (number(&sql), params)
}

/// `sql` with its `?` parameters numbered in order (`?1`, `?2`, …), the form both backends
/// take.
fn number(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut n = 0;
    for c in sql.chars() {
        out.push(c);
        if c == '?' {
            n += 1;
            out.push_str(&n.to_string());
        }
    }
    out
}

/// Whether `name` matches `glob`: `*` any run of characters, `?` any one, anything else
/// itself.
pub fn glob_match(glob: &str, name: &str) -> bool {
    let g: Vec<char> = glob.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut gi, mut ni) = (0, 0);
    // Where the last `*` was and how much of the name it had taken, to backtrack to.
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match g.get(gi) {
            Some('*') => {
                star = Some((gi, ni));
                gi += 1;
            }
            Some(&c) if c == '?' || c == n[ni] => {
                gi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sg, sn)) => {
                    gi = sg + 1;
                    ni = sn + 1;
                    star = Some((sg, sn + 1));
                }
                None => return false,
            },
        }
    }
    g[gi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
pub(crate) fn plan(catalog: &Catalog, query: &Query) -> Vec<String> {
    let (sql, params) = compose(query);
    let args: Vec<_> = params.iter().map(Val::as_arg).collect();
    let rows = catalog
        .lock()
        .rows(&format!("EXPLAIN QUERY PLAN {sql}"), &args)
        .expect("the plan runs");
    rows.into_iter()
        .map(|mut r| r.text(3).expect("a plan row"))
        .collect()
}
