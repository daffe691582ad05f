//! `--exclude`/`--include`/`--filter-from` rules, with rsync's meaning: the first rule that
//! matches a path decides, a path no rule matches is sent, and an excluded directory is not
//! entered (its contents are never tried). Patterns match the path as it arrives under the
//! destination (`dir/a.txt` for a put of `dir`): a leading `/` anchors a pattern there, else
//! it matches the path's last components at any depth; a trailing `/` matches directories
//! only; `*` and `?` stop at `/`, `**` crosses it, and `dir/***` is both `dir/` and
//! `dir/**`. The rule `!` clears the rules before it; a `--filter-from` file may `merge` (or
//! `.`) another. The glob itself is globset's.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use globset::{GlobBuilder, GlobMatcher};

/// A bad rule, named as the user wrote it.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("bad filter pattern `{pattern}`: {cause}")]
    Pattern { pattern: String, cause: String },
    #[error("cannot read filter file {path}: {cause}")]
    Read { path: String, cause: std::io::Error },
    #[error(
        "{path}:{line}: `{text}` is not a filter rule (use `+ PATTERN`, `- PATTERN`, `!`, \
         `merge FILE`, or `#` for a comment)"
    )]
    Line {
        path: String,
        line: usize,
        text: String,
    },
    #[error("{path}: merge files nest more than {MAX_MERGE_DEPTH} deep (a file merging itself?)")]
    TooDeep { path: String },
}

/// How deep `merge` files may nest: deeper is taken for a loop.
pub const MAX_MERGE_DEPTH: usize = 16;

/// Whether a matching rule sends the path or leaves it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Include,
    Exclude,
}

#[derive(Clone, Debug)]
struct Rule {
    action: Action,
    dir_only: bool,
    matcher: GlobMatcher,
}

/// An ordered list of rules; the empty list sends everything.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    rules: Vec<Rule>,
    /// A sync's: paths are judged without their first component, the top's name on the wire,
    /// since a sync's rules are written for the tree's contents (rsync's `SRC/`).
    below_top: bool,
    /// A sync's: files (below the top) whose size and mtime match at the destination, neither
    /// sent nor taken, so that neither end reads them.
    unchanged: Option<Arc<HashSet<String>>>,
    /// A sync's between two servers: the only paths sent, as its client listed and compared
    /// them; the rules are not consulted (the client applied them).
    only: Option<Arc<HashSet<String>>>,
}

impl Filter {
    /// True when no rule was given (everything is sent).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.unchanged.is_none() && self.only.is_none()
    }

    /// A filter that lets through exactly `paths` (files and directories, as on the wire) and
    /// nothing else: a source server sends a sync's changed files, whose client did the
    /// filtering and the comparing.
    pub fn only(paths: HashSet<String>) -> Self {
        Self {
            only: Some(Arc::new(paths)),
            ..Self::default()
        }
    }

    /// This filter as a sync's transfer uses it: judging paths below the top's name (which
    /// itself always passes), and leaving out the `unchanged` files.
    pub fn for_sync(mut self, unchanged: HashSet<String>) -> Self {
        self.below_top = true;
        self.unchanged = Some(Arc::new(unchanged));
        self
    }

    /// Appends a rule; rules added earlier take precedence. The pattern `!` clears the rules
    /// added so far (rsync's list reset).
    pub fn add(&mut self, action: Action, pattern: &str) -> Result<(), FilterError> {
        let bad = |cause: &str| FilterError::Pattern {
            pattern: pattern.to_owned(),
            cause: cause.to_owned(),
        };
        if pattern == "!" {
            self.rules.clear();
            return Ok(());
        }
        // `dir/***` is `dir/` (the directory itself) then `dir/**` (all below it).
        if let Some(dir) = pattern.strip_suffix("/***") {
            if dir.is_empty() || dir == "/" {
                return Err(bad("it names no directory"));
            }
            let dir_rule = Self::rule(action, &format!("{dir}/")).map_err(|e| bad(&e))?;
            let below = Self::rule(action, &format!("{dir}/**")).map_err(|e| bad(&e))?;
            self.rules.extend([dir_rule, below]);
            return Ok(());
        }
        let rule = Self::rule(action, pattern).map_err(|e| bad(&e))?;
        self.rules.push(rule);
        Ok(())
    }

    /// Compiles one pattern (anchoring, dir-only, rsync's `**`) into a rule.
    fn rule(action: Action, pattern: &str) -> Result<Rule, String> {
        let (body, dir_only) = match pattern.strip_suffix('/') {
            Some(b) => (b, true),
            None => (pattern, false),
        };
        let (body, anchored) = match body.strip_prefix('/') {
            Some(b) => (b, true),
            None => (body, false),
        };
        if body.is_empty() {
            return Err("it names no file".to_owned());
        }
        let body = double_stars(body, anchored)?;
        // Unanchored, the pattern may start at any component: `**/` matches zero or more.
        let glob = if anchored { body } else { format!("**/{body}") };
        let matcher = GlobBuilder::new(&glob)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| e.kind().to_string())?
            .compile_matcher();
        Ok(Rule {
            action,
            dir_only,
            matcher,
        })
    }

    /// Appends the rules of a `--filter-from` text: `+ PATTERN` includes, `- PATTERN`
    /// excludes, `!` (or `clear`) drops the rules so far, `merge FILE` (or `. FILE`) reads
    /// FILE's rules in place; lines starting with `#` or `;` and blank lines are ignored.
    /// `name` is what errors call the text.
    pub fn add_text(&mut self, name: &str, text: &str) -> Result<(), FilterError> {
        self.add_text_nested(name, text, 0)
    }

    fn add_text_nested(&mut self, name: &str, text: &str, depth: usize) -> Result<(), FilterError> {
        for (i, line) in text.lines().enumerate() {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.trim().is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if line == "!" || line == "clear" {
                self.rules.clear();
                continue;
            }
            if let Some(file) = line
                .strip_prefix("merge ")
                .or_else(|| line.strip_prefix(". "))
            {
                self.merge(Path::new(file), depth + 1)?;
                continue;
            }
            let (action, pattern) = if let Some(p) = line.strip_prefix("+ ") {
                (Action::Include, p)
            } else if let Some(p) = line.strip_prefix("- ") {
                (Action::Exclude, p)
            } else {
                return Err(FilterError::Line {
                    path: name.to_owned(),
                    line: i + 1,
                    text: line.to_owned(),
                });
            };
            self.add(action, pattern)?;
        }
        Ok(())
    }

    /// Appends the rules of a `--filter-from` file (see [`Filter::add_text`]).
    pub fn add_file(&mut self, path: &Path) -> Result<(), FilterError> {
        self.merge(path, 0)
    }

    /// Reads a rules file at nesting `depth`; a relative `merge` name is taken from the
    /// working directory, as rsync takes it.
    fn merge(&mut self, path: &Path, depth: usize) -> Result<(), FilterError> {
        let name = path.display().to_string();
        if depth > MAX_MERGE_DEPTH {
            return Err(FilterError::TooDeep { path: name });
        }
        let text = std::fs::read_to_string(path).map_err(|cause| FilterError::Read {
            path: name.clone(),
            cause,
        })?;
        self.add_text_nested(&name, &text, depth)
    }

    /// Whether `rel` (a `/`-separated path under the transfer root) is sent, judged by the
    /// first rule that matches it; its parents are not looked at (a walk never reaches the
    /// contents of a directory this refused).
    pub fn allows(&self, rel: &str, is_dir: bool) -> bool {
        let mut rel = rel.trim_matches('/');
        if self.below_top {
            match rel.split_once('/') {
                Some((_, below)) => rel = below,
                None => return true,
            }
        }
        if let Some(only) = &self.only {
            return only.contains(rel);
        }
        if !is_dir && self.unchanged.as_ref().is_some_and(|u| u.contains(rel)) {
            return false;
        }
        for rule in &self.rules {
            if rule.dir_only && !is_dir {
                continue;
            }
            if rule.matcher.is_match(rel) {
                return rule.action == Action::Include;
            }
        }
        true
    }

    /// Whether `rel` is sent once its parent directories are judged too, for a side that
    /// sees paths without walking them (a get's receiver): a file below an excluded directory
    /// is left out, as the walk would have left it.
    pub fn admits(&self, rel: &str, is_dir: bool) -> bool {
        let rel = rel.trim_matches('/');
        let mut parents = rel.match_indices('/').map(|(i, _)| &rel[..i]);
        parents.all(|p| self.allows(p, true)) && self.allows(rel, is_dir)
    }
}

/// Rewrites rsync's `**` (any characters, `/` included) as globset's, whose `**` is a whole
/// component matching zero or more of them: in rsync `a/**/b` needs a directory between `a`
/// and `b` and so does an anchored `/**/b`, while a leading `**/` of an unanchored pattern
/// also matches at the top. A `**` inside a component (`a**`) has no globset form: refused.
fn double_stars(body: &str, anchored: bool) -> Result<String, &'static str> {
    let parts: Vec<&str> = body.split('/').collect();
    let last = parts.len() - 1;
    let mut out = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        if *part == "**" {
            let at_least_one = i != last && (i != 0 || anchored);
            out.push(if at_least_one {
                "*/**".to_owned()
            } else {
                "**".to_owned()
            });
        } else if part.contains("**") {
            return Err("`**` must be a whole path component (`a/**/b`, `**/b`, `a/**`)");
        } else {
            out.push(literal_braces(part));
        }
    }
    Ok(out.join("/"))
}

/// rsync has no `{a,b}` alternation, so braces are literal (outside a `[...]` class).
fn literal_braces(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len());
    let mut chars = pattern.chars().peekable();
    let mut in_class = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                out.push(c);
                if let Some(n) = chars.next() {
                    out.push(n);
                }
                continue;
            }
            '[' if !in_class => {
                in_class = true;
                out.push(c);
                // A `]` first in the class (after any negation) is a member, not its end.
                if let Some(&n) = chars.peek() {
                    if n == '!' || n == '^' {
                        out.push(n);
                        chars.next();
                    }
                }
                if chars.peek() == Some(&']') {
                    out.push(']');
                    chars.next();
                }
                continue;
            }
            ']' if in_class => in_class = false,
            '{' | '}' | ',' if !in_class => out.push('\\'),
            _ => {}
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(rules: &[(Action, &str)]) -> Filter {
        let mut f = Filter::default();
        for (a, p) in rules {
            f.add(*a, p).unwrap();
        }
        f
    }

    use Action::{Exclude as X, Include as I};

    #[test]
    fn only_lets_through_exactly_its_paths() {
        let set = ["a.txt", "sub", "sub/b.bin"].map(String::from);
        let f = Filter::only(set.into_iter().collect());
        assert!(!f.is_empty());
        assert!(f.allows("a.txt", false) && f.allows("sub", true));
        assert!(f.allows("sub/b.bin", false) && f.allows("/sub/b.bin/", false));
        assert!(!f.allows("sub/c.bin", false) && !f.allows("other", true));
        assert!(!f.admits("other/sub/b.bin", false));
    }

    #[test]
    fn unanchored_matches_the_last_components_at_any_depth() {
        let f = filter(&[(X, "*.o"), (X, "sub/b")]);
        assert!(!f.allows("a.o", false));
        assert!(!f.allows("d/e/a.o", false));
        assert!(f.allows("a.c", false));
        assert!(!f.allows("sub/b", false));
        assert!(!f.allows("x/sub/b", false));
        assert!(f.allows("xsub/b", false));
        assert!(f.allows("sub/b/c", false));
    }

    #[test]
    fn a_leading_slash_anchors_at_the_transfer_root() {
        let f = filter(&[(X, "/top.txt"), (X, "/d/*.log")]);
        assert!(!f.allows("top.txt", false));
        assert!(f.allows("d/top.txt", false));
        assert!(!f.allows("d/a.log", false));
        assert!(f.allows("e/d/a.log", false));
    }

    #[test]
    fn a_trailing_slash_matches_directories_only() {
        let f = filter(&[(X, "cache/")]);
        assert!(!f.allows("cache", true));
        assert!(!f.allows("a/cache", true));
        assert!(f.allows("cache", false));
    }

    #[test]
    fn star_stops_at_slash_and_double_star_crosses_it() {
        let f = filter(&[(X, "/a/*.txt")]);
        assert!(!f.allows("a/x.txt", false));
        assert!(f.allows("a/b/x.txt", false));
        // As in rsync, `/**/` in the middle stands for at least one directory.
        let f = filter(&[(X, "/b/**/z")]);
        assert!(f.allows("b/z", false));
        assert!(!f.allows("b/c/d/z", false));
        let f = filter(&[(X, "**/z")]);
        assert!(!f.allows("z", false));
        assert!(!f.allows("b/c/z", false));
        let f = filter(&[(X, "/a/**")]);
        assert!(!f.allows("a/b/c", false));
        assert!(f.allows("b/a/c", false));
    }

    #[test]
    fn question_mark_and_classes() {
        let f = filter(&[(X, "?.c"), (X, "[ab]*.h"), (X, "[!x]y")]);
        assert!(!f.allows("d/z.c", false));
        assert!(f.allows("zz.c", false));
        assert!(!f.allows("b1.h", false));
        assert!(f.allows("c1.h", false));
        assert!(!f.allows("zy", false));
        assert!(f.allows("xy", false));
    }

    #[test]
    fn braces_are_literal_as_in_rsync() {
        let f = filter(&[(X, "{a,b}")]);
        assert!(f.allows("a", false));
        assert!(!f.allows("{a,b}", false));
    }

    #[test]
    fn the_first_matching_rule_wins() {
        let f = filter(&[(I, "keep.log"), (X, "*.log")]);
        assert!(f.allows("keep.log", false));
        assert!(!f.allows("other.log", false));
        let f = filter(&[(X, "*.log"), (I, "keep.log")]);
        assert!(!f.allows("keep.log", false));
        assert!(f.allows("anything", true));
    }

    #[test]
    fn admits_judges_the_parents() {
        let f = filter(&[(I, "*/"), (I, "*.txt"), (X, "*")]);
        assert!(f.admits("a/b/c.txt", false));
        assert!(!f.admits("a/b/c.bin", false));
        let f = filter(&[(X, "/skip/"), (I, "*.txt")]);
        assert!(!f.admits("skip/c.txt", false));
        assert!(f.admits("keep/c.txt", false));
    }

    #[test]
    fn filter_text_rules_comments_and_blank_lines() {
        let mut f = Filter::default();
        f.add_text("rules", "# comment\n; also\n\n+ keep.o\n- *.o\r\n")
            .unwrap();
        assert!(f.allows("keep.o", false));
        assert!(!f.allows("x/y.o", false));
        let err = Filter::default()
            .add_text("rules", "+ a\nexclude b\n")
            .unwrap_err();
        assert!(err.to_string().contains("rules:2"), "{err}");
        assert!(err.to_string().contains("exclude b"), "{err}");
    }

    #[test]
    fn bang_clears_the_rules_before_it() {
        let f = filter(&[(X, "*.o"), (X, "!"), (X, "*.c")]);
        assert!(f.allows("a.o", false));
        assert!(!f.allows("a.c", false));
        let mut f = Filter::default();
        f.add_text("rules", "- *.o\n!\n- *.c\n").unwrap();
        assert!(f.allows("a.o", false));
        assert!(!f.allows("a.c", false));
    }

    #[test]
    fn triple_star_is_the_directory_and_all_below_it() {
        let f = filter(&[(X, "/a/***")]);
        assert!(!f.allows("a", true));
        assert!(f.allows("a", false));
        assert!(!f.allows("a/b/c", false));
        assert!(f.allows("b/a/c", false));
        assert!(Filter::default().add(X, "/***").is_err());
    }

    #[test]
    fn merge_reads_another_file_in_place_and_stops_loops() {
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("inner");
        std::fs::write(&inner, "+ keep.o\n").unwrap();
        let outer = dir.path().join("outer");
        let text = format!("merge {}\n- *.o\n. {}\n", inner.display(), inner.display());
        std::fs::write(&outer, text).unwrap();
        let mut f = Filter::default();
        f.add_file(&outer).unwrap();
        assert!(f.allows("keep.o", false));
        assert!(!f.allows("x.o", false));
        let selfish = dir.path().join("loop");
        std::fs::write(&selfish, format!("merge {}\n", selfish.display())).unwrap();
        let err = Filter::default().add_file(&selfish).unwrap_err();
        assert!(err.to_string().contains("nest"), "{err}");
        let err = Filter::default()
            .add_text("rules", "merge /nonexistent/x\n")
            .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/x"), "{err}");
    }

    #[test]
    fn a_sync_judges_below_the_top_and_leaves_unchanged_files_out() {
        let unchanged = ["d/same.txt".to_owned()].into_iter().collect();
        let f = filter(&[(X, "/skip/")]).for_sync(unchanged);
        assert!(f.allows("top", true));
        assert!(!f.allows("top/skip", true));
        assert!(!f.admits("top/skip/x", false));
        assert!(!f.allows("top/d/same.txt", false));
        assert!(f.allows("top/d/other.txt", false));
        assert!(!f.is_empty());
    }

    #[test]
    fn bad_patterns_are_named() {
        for bad in ["[abc", "/", "", "a**", "/x/**.txt"] {
            let err = Filter::default().add(X, bad).unwrap_err();
            assert!(err.to_string().contains(&format!("`{bad}`")), "{err}");
        }
        let err = Filter::default()
            .add_file(Path::new("/nonexistent/rules"))
            .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/rules"), "{err}");
    }
}
