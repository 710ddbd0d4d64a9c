//! Ceph's decompiled CRUSH map text format (what `crushtool -d` prints and `crushtool -c`
//! reads): parse it into a `CrushMap` and print a map back in exactly Ceph's layout, so that maps
//! move between Ceph and Kelp unchanged and outputs can be diffed line by line.
//!
//! Parsing follows the compiler's semantics: tunables absent from the text keep their legacy
//! values; weights are 32-bit floats truncated to 16.16; an item line without `weight` takes
//! 1.0 for a device and the child's weight for a bucket; `take X class C` resolves to the shadow
//! bucket of X for class C.

use std::fmt::Write as _;

use crate::error::{CrushError, Result};
use crate::map::{
    ALG_LIST, ALG_STRAW, ALG_STRAW2, ALG_TREE, ALG_UNIFORM, CrushMap, ItemId, RULE_TYPE_ERASURE,
    RULE_TYPE_REPLICATED, Rule, Step, Tunables, format_weight, weight_from_f32,
};

#[derive(Debug, Clone)]
struct Token<'a> {
    text: &'a str,
    line: usize,
}

fn tokenize(text: &str) -> Vec<Token<'_>> {
    let mut tokens = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("");
        for word in line.split_whitespace() {
            // Braces may be glued to words (`host0{`); split them out.
            let mut rest = word;
            while !rest.is_empty() {
                match rest.find(['{', '}']) {
                    Some(0) => {
                        tokens.push(Token {
                            text: &rest[..1],
                            line: n + 1,
                        });
                        rest = &rest[1..];
                    }
                    Some(i) => {
                        tokens.push(Token {
                            text: &rest[..i],
                            line: n + 1,
                        });
                        rest = &rest[i..];
                    }
                    None => {
                        tokens.push(Token {
                            text: rest,
                            line: n + 1,
                        });
                        rest = "";
                    }
                }
            }
        }
    }
    tokens
}

struct Parser<'a> {
    tokens: Vec<Token<'a>>,
    pos: usize,
    last_line: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<&'a str> {
        self.tokens.get(self.pos).map(|t| t.text)
    }

    fn line(&self) -> usize {
        self.tokens.get(self.pos).map_or(self.last_line, |t| t.line)
    }

    fn err<T>(&self, message: impl Into<String>) -> Result<T> {
        Err(CrushError::Parse {
            line: self.line(),
            message: message.into(),
        })
    }

    fn next(&mut self, what: &str) -> Result<&'a str> {
        match self.tokens.get(self.pos) {
            Some(t) => {
                self.pos += 1;
                Ok(t.text)
            }
            None => self.err(format!("unexpected end of map, expected {what}")),
        }
    }

    fn expect(&mut self, want: &str) -> Result<()> {
        let line = self.line();
        let got = self.next(&format!("'{want}'"))?;
        if got != want {
            return Err(CrushError::Parse {
                line,
                message: format!("expected '{want}', found '{got}'"),
            });
        }
        Ok(())
    }

    fn int<T: std::str::FromStr>(&mut self, what: &str) -> Result<T> {
        let line = self.line();
        let tok = self.next(what)?;
        tok.parse::<T>().map_err(|_| CrushError::Parse {
            line,
            message: format!("expected {what} (an integer), found '{tok}'"),
        })
    }

    fn weight(&mut self) -> Result<u32> {
        let line = self.line();
        let tok = self.next("a weight")?;
        tok.parse::<f32>()
            .ok()
            .and_then(weight_from_f32)
            .ok_or_else(|| CrushError::Parse {
                line,
                message: format!("'{tok}' is not a valid weight (a number from 0 to 65535)"),
            })
    }

    /// Runs a map-building call, attaching the current line to its error.
    fn at<T>(&self, line: usize, r: Result<T>) -> Result<T> {
        r.map_err(|e| match e {
            CrushError::Parse { .. } => e,
            other => CrushError::Parse {
                line,
                message: other.to_string(),
            },
        })
    }
}

/// Parses Ceph's text CRUSH map format into a finalized map.
pub fn parse_text(text: &str) -> Result<CrushMap> {
    let tokens = tokenize(text);
    let last_line = text.lines().count().max(1);
    let mut p = Parser {
        tokens,
        pos: 0,
        last_line,
    };
    let mut map = CrushMap::new();
    map.tunables = Tunables::legacy();
    while let Some(word) = p.peek() {
        let line = p.line();
        match word {
            "tunable" => {
                p.pos += 1;
                let name = p.next("a tunable name")?;
                let value: u32 = p.int("a tunable value")?;
                p.at(line, map.tunables.set(name, value))?;
            }
            "device" => {
                p.pos += 1;
                let id: ItemId = p.int("a device id")?;
                let name = p.next("a device name")?;
                let class = if p.peek() == Some("class") {
                    p.pos += 1;
                    Some(p.next("a class name")?)
                } else {
                    None
                };
                p.at(line, map.add_device(id, name, class))?;
            }
            "type" => {
                p.pos += 1;
                let id: u32 = p.int("a type id")?;
                let name = p.next("a type name")?;
                p.at(line, map.add_type(id, name))?;
            }
            "rule" => parse_rule(&mut p, &mut map)?,
            "choose_args" => {
                return p.err(
                    "choose_args (weight sets) are not supported yet; remove the section \
                     (crushtool --test ignores it unless --choose-args is given)",
                );
            }
            other => match map.type_id(other) {
                Some(type_id) => parse_bucket(&mut p, &mut map, type_id)?,
                None => {
                    return p.err(format!(
                        "'{other}' is neither a keyword (tunable, device, type, rule) nor a \
                         defined bucket type"
                    ));
                }
            },
        }
    }
    let line = p.line();
    p.at(line, map.finalize())?;
    Ok(map)
}

fn parse_bucket(p: &mut Parser<'_>, map: &mut CrushMap, type_id: u32) -> Result<()> {
    let type_name = p.next("a bucket type")?;
    let start = p.line();
    let name = p.next("a bucket name")?;
    p.expect("{")?;
    let mut id: Option<ItemId> = None;
    let mut class_ids: Vec<(&str, ItemId, usize)> = Vec::new();
    let mut items: Vec<(ItemId, Option<u32>)> = Vec::new();
    loop {
        let line = p.line();
        let key = p.next("'}' closing the bucket")?;
        match key {
            "}" => break,
            "id" => {
                let value: ItemId = p.int("a bucket id")?;
                if p.peek() == Some("class") {
                    p.pos += 1;
                    let class = p.next("a class name")?;
                    class_ids.push((class, value, line));
                } else if id.replace(value).is_some() {
                    return p.err(format!("bucket '{name}' has two ids"));
                }
            }
            "alg" => {
                let alg = p.next("a bucket algorithm")?;
                let code = match alg {
                    "straw2" => ALG_STRAW2,
                    "uniform" => ALG_UNIFORM,
                    "list" => ALG_LIST,
                    "tree" => ALG_TREE,
                    "straw" => ALG_STRAW,
                    _ => {
                        return Err(CrushError::Parse {
                            line,
                            message: format!("unknown bucket algorithm '{alg}'"),
                        });
                    }
                };
                if code != ALG_STRAW2 {
                    return Err(CrushError::Parse {
                        line,
                        message: format!(
                            "bucket '{name}' uses alg {alg}: only straw2 is supported (it is \
                             Ceph's default since Luminous; convert with \
                             `ceph osd crush set-all-straw-buckets-to-straw2`)"
                        ),
                    });
                }
            }
            "hash" => {
                let h = p.next("a hash id")?;
                if h != "0" && h != "rjenkins1" {
                    return Err(CrushError::Parse {
                        line,
                        message: format!(
                            "bucket '{name}' uses hash '{h}': only 0 (rjenkins1) exists"
                        ),
                    });
                }
            }
            "item" => {
                let item_name = p.next("an item name")?;
                let Some(item) = map.item_id(item_name) else {
                    return Err(CrushError::Parse {
                        line,
                        message: format!(
                            "item '{item_name}' in bucket '{name}' is not defined (define \
                             devices and buckets before using them)"
                        ),
                    });
                };
                let mut weight = None;
                while let Some(attr) = p.peek() {
                    match attr {
                        "weight" => {
                            p.pos += 1;
                            weight = Some(p.weight()?);
                        }
                        "pos" => {
                            p.pos += 1;
                            let pos: usize = p.int("an item position")?;
                            if pos != items.len() {
                                return Err(CrushError::Parse {
                                    line,
                                    message: format!(
                                        "item '{item_name}' has pos {pos} but is item number \
                                         {}: list items in position order",
                                        items.len()
                                    ),
                                });
                            }
                        }
                        _ => break,
                    }
                }
                items.push((item, weight));
            }
            other => {
                return Err(CrushError::Parse {
                    line,
                    message: format!(
                        "unexpected '{other}' in {type_name} '{name}' (expected id, alg, hash, \
                         item or '}}')"
                    ),
                });
            }
        }
    }
    let bucket = p.at(start, map.add_bucket(id, name, type_id, &items))?;
    for (class, shadow, line) in class_ids {
        p.at(line, map.set_shadow_id(bucket, class, shadow))?;
    }
    Ok(())
}

fn parse_rule(p: &mut Parser<'_>, map: &mut CrushMap) -> Result<()> {
    p.expect("rule")?;
    let start = p.line();
    let name = match p.peek() {
        Some("{") => return p.err("a rule needs a name: rule NAME { … }"),
        _ => p.next("a rule name")?,
    };
    p.expect("{")?;
    let mut id: Option<u32> = None;
    let mut rule_type: Option<u8> = None;
    let mut min_size = 1u32;
    let mut max_size = 10u32;
    let mut steps = Vec::new();
    loop {
        let line = p.line();
        let key = p.next("'}' closing the rule")?;
        match key {
            "}" => break,
            "id" | "ruleset" => id = Some(p.int("a rule id")?),
            "type" => {
                let t = p.next("a rule type")?;
                rule_type = Some(match t {
                    "replicated" => RULE_TYPE_REPLICATED,
                    "erasure" => RULE_TYPE_ERASURE,
                    _ => {
                        return Err(CrushError::Parse {
                            line,
                            message: format!(
                                "unknown rule type '{t}' (expected replicated or erasure)"
                            ),
                        });
                    }
                });
            }
            "min_size" => min_size = p.int("min_size")?,
            "max_size" => max_size = p.int("max_size")?,
            "step" => steps.push(parse_step(p, map, name)?),
            other => {
                return Err(CrushError::Parse {
                    line,
                    message: format!(
                        "unexpected '{other}' in rule '{name}' (expected id, type, min_size, \
                         max_size, step or '}}')"
                    ),
                });
            }
        }
    }
    let Some(id) = id else {
        return Err(CrushError::Parse {
            line: start,
            message: format!("rule '{name}' has no id"),
        });
    };
    let rule = Rule {
        id,
        name: name.to_string(),
        rule_type: rule_type.unwrap_or(RULE_TYPE_REPLICATED),
        min_size,
        max_size,
        steps,
    };
    p.at(start, map.add_rule(rule))
}

fn parse_step(p: &mut Parser<'_>, map: &mut CrushMap, rule: &str) -> Result<Step> {
    let line = p.line();
    let op = p.next("a step")?;
    let bad = |message: String| Err(CrushError::Parse { line, message });
    Ok(match op {
        "take" => {
            let item_name = p.next("an item to take")?;
            let Some(mut item) = map.item_id(item_name) else {
                return bad(format!(
                    "rule '{rule}' takes '{item_name}', which is not defined"
                ));
            };
            if p.peek() == Some("class") {
                p.pos += 1;
                let class = p.next("a class name")?;
                let Some(class_id) = map.class_id(class) else {
                    return bad(format!(
                        "rule '{rule}': device class '{class}' does not exist"
                    ));
                };
                if !map.finalized {
                    p.at(line, map.finalize())?;
                }
                let Some(shadow) = map.shadow_of(item, class_id) else {
                    return bad(format!(
                        "rule '{rule}': '{item_name}' has no shadow tree for class '{class}'"
                    ));
                };
                item = shadow;
            }
            Step::Take(item)
        }
        "choose" | "chooseleaf" => {
            let mode = p.next("firstn or indep")?;
            let indep = match mode {
                "firstn" => false,
                "indep" => true,
                _ => {
                    return bad(format!(
                        "expected firstn or indep after {op}, found '{mode}'"
                    ));
                }
            };
            let num: i32 = p.int("the number of items to choose")?;
            p.expect("type")?;
            let type_name = p.next("a type name")?;
            let Some(type_id) = map.type_id(type_name) else {
                return bad(format!(
                    "rule '{rule}' chooses type '{type_name}', which is not defined"
                ));
            };
            Step::Choose {
                leaf: op == "chooseleaf",
                indep,
                num,
                type_id,
            }
        }
        "emit" => Step::Emit,
        "set_choose_tries" => Step::SetChooseTries(p.int("a number of tries")?),
        "set_chooseleaf_tries" => Step::SetChooseleafTries(p.int("a number of tries")?),
        "set_choose_local_tries" => Step::SetChooseLocalTries(p.int("a number of tries")?),
        "set_choose_local_fallback_tries" => {
            Step::SetChooseLocalFallbackTries(p.int("a number of tries")?)
        }
        "set_chooseleaf_vary_r" => Step::SetChooseleafVaryR(p.int("0 or 1")?),
        "set_chooseleaf_stable" => Step::SetChooseleafStable(p.int("0 or 1")?),
        other => {
            return bad(format!(
                "unknown step '{other}' (expected take, choose, chooseleaf, emit or set_*)"
            ));
        }
    })
}

impl CrushMap {
    /// Prints the map in Ceph's decompiled text format (`crushtool -d`).
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        out.push_str("# begin crush map\n");
        let legacy = Tunables::legacy();
        for ((name, value), (_, base)) in self.tunables.entries().iter().zip(legacy.entries()) {
            if *value != base {
                let _ = writeln!(out, "tunable {name} {value}");
            }
        }
        out.push_str("\n# devices\n");
        for d in self.devices.values() {
            let _ = write!(out, "device {} {}", d.id, d.name);
            if let Some(c) = d.class.and_then(|c| self.class_name(c)) {
                let _ = write!(out, " class {c}");
            }
            out.push('\n');
        }
        out.push_str("\n# types\n");
        for (id, name) in &self.types {
            let _ = writeln!(out, "type {id} {name}");
        }
        out.push_str("\n# buckets\n");
        let mut done = std::collections::HashSet::new();
        let mut ids: Vec<ItemId> = self.buckets().map(|b| b.id).collect();
        ids.sort_unstable_by(|a, b| b.cmp(a));
        for id in ids {
            self.write_bucket_tree(id, &mut done, &mut out);
        }
        out.push_str("\n# rules\n");
        for rule in self.rules() {
            self.write_rule(rule, &mut out);
        }
        out.push_str("\n# end crush map\n");
        out
    }

    /// Children before parents, each bucket once.
    fn write_bucket_tree(
        &self,
        id: ItemId,
        done: &mut std::collections::HashSet<ItemId>,
        out: &mut String,
    ) {
        if !done.insert(id) {
            return;
        }
        let Some(b) = self.bucket(id) else { return };
        for &item in &b.items {
            if item < 0 {
                self.write_bucket_tree(item, done, out);
            }
        }
        let type_name = self.type_name(b.type_id).unwrap_or("?");
        let _ = writeln!(out, "{type_name} {} {{", b.name);
        let _ = writeln!(out, "\tid {}\t\t# do not change unnecessarily", b.id);
        if let Some(per_class) = self.class_bucket.get(&b.id) {
            for (class, shadow) in per_class {
                let cname = self.class_name(*class).unwrap_or("?");
                let _ = writeln!(
                    out,
                    "\tid {shadow} class {cname}\t\t# do not change unnecessarily"
                );
            }
        }
        let _ = writeln!(out, "\t# weight {}", format_weight(b.weight));
        out.push_str("\talg straw2\n");
        out.push_str("\thash 0\t# rjenkins1\n");
        for (&item, &w) in b.items.iter().zip(&b.item_weights) {
            let name = self.item_name(item).unwrap_or("?");
            let _ = writeln!(out, "\titem {name} weight {}", format_weight(w));
        }
        out.push_str("}\n");
    }

    fn write_rule(&self, rule: &Rule, out: &mut String) {
        let _ = writeln!(out, "rule {} {{", rule.name);
        let _ = writeln!(out, "\tid {}", rule.id);
        match rule.rule_type {
            RULE_TYPE_REPLICATED => out.push_str("\ttype replicated\n"),
            RULE_TYPE_ERASURE => out.push_str("\ttype erasure\n"),
            other => {
                let _ = writeln!(out, "\ttype {other}");
            }
        }
        let _ = writeln!(out, "\tmin_size {}", rule.min_size);
        let _ = writeln!(out, "\tmax_size {}", rule.max_size);
        for step in &rule.steps {
            out.push_str("\tstep ");
            match *step {
                Step::Take(item) => match self.bucket(item).and_then(|b| b.shadow_of) {
                    Some((orig, class)) => {
                        let _ = write!(
                            out,
                            "take {} class {}",
                            self.item_name(orig).unwrap_or("?"),
                            self.class_name(class).unwrap_or("?")
                        );
                    }
                    None => {
                        let _ = write!(out, "take {}", self.item_name(item).unwrap_or("?"));
                    }
                },
                Step::Choose {
                    leaf,
                    indep,
                    num,
                    type_id,
                } => {
                    let _ = write!(
                        out,
                        "{} {} {num} type {}",
                        if leaf { "chooseleaf" } else { "choose" },
                        if indep { "indep" } else { "firstn" },
                        self.type_name(type_id).unwrap_or("?")
                    );
                }
                Step::Emit => out.push_str("emit"),
                Step::SetChooseTries(n) => {
                    let _ = write!(out, "set_choose_tries {n}");
                }
                Step::SetChooseleafTries(n) => {
                    let _ = write!(out, "set_chooseleaf_tries {n}");
                }
                Step::SetChooseLocalTries(n) => {
                    let _ = write!(out, "set_choose_local_tries {n}");
                }
                Step::SetChooseLocalFallbackTries(n) => {
                    let _ = write!(out, "set_choose_local_fallback_tries {n}");
                }
                Step::SetChooseleafVaryR(n) => {
                    let _ = write!(out, "set_chooseleaf_vary_r {n}");
                }
                Step::SetChooseleafStable(n) => {
                    let _ = write!(out, "set_chooseleaf_stable {n}");
                }
            }
            out.push('\n');
        }
        out.push_str("}\n");
    }
}
