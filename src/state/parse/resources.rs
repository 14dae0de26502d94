//! The resources: counted when managed and holding a current object; the
//! instances' attributes are skipped.

use super::{Parser, Typed};
use crate::state::Corruption;
use crate::state::lexer::Blocks;

impl<B: Blocks> Parser<B> {
    pub(super) fn resources(&mut self) -> Result<(), Corruption> {
        self.parsed.managed_resources = 0;
        if !self.enter(b'[', "resources is not an array")? {
            return Ok(());
        }
        let mut first = true;
        while self.next_element(&mut first)? {
            if self.resource()? {
                self.parsed.managed_resources += 1;
            }
        }
        Ok(())
    }

    /// Whether the resource is managed and has a current object.
    fn resource(&mut self) -> Result<bool, Corruption> {
        let offset = self.src.offset();
        if !self.enter(b'{', "a resource is not an object")? {
            self.shape(offset, "a resource is not an object");
            return Ok(false);
        }
        let mut managed = None;
        let mut current = false;
        let mut first = true;
        let mut seen = 0u32;
        loop {
            let offset = self.src.offset();
            let Some(key) = self.next_key(&mut first)? else {
                break;
            };
            if key.is(b"mode") {
                self.once(&mut seen, 1, offset, "mode");
                match self.short_string_value()? {
                    Typed::Value(mode) if mode.is(b"managed") => managed = Some(true),
                    Typed::Value(mode) if mode.is(b"data") => managed = Some(false),
                    _ => self.shape(offset, "a resource's mode is neither managed nor data"),
                }
            } else if key.is(b"instances") {
                self.once(&mut seen, 2, offset, "instances");
                current = self.instances()?;
            } else {
                self.skip_value()?;
            }
        }
        if managed.is_none() {
            self.shape(offset, "a resource has no mode");
        }
        Ok(managed == Some(true) && current)
    }

    /// Whether any instance object is current (not deposed).
    fn instances(&mut self) -> Result<bool, Corruption> {
        if !self.enter(b'[', "a resource's instances is not an array")? {
            return Ok(false);
        }
        let mut current = false;
        let mut first = true;
        while self.next_element(&mut first)? {
            current |= self.instance()?;
        }
        Ok(current)
    }

    /// Whether the instance object is current; its attributes are skipped.
    fn instance(&mut self) -> Result<bool, Corruption> {
        let offset = self.src.offset();
        if !self.enter(b'{', "an instance is not an object")? {
            self.shape(offset, "an instance is not an object");
            return Ok(false);
        }
        let mut deposed = false;
        let mut first = true;
        let mut seen = 0u32;
        loop {
            let offset = self.src.offset();
            let Some(key) = self.next_key(&mut first)? else {
                break;
            };
            if key.is(b"deposed") {
                self.once(&mut seen, 1, offset, "deposed");
                match self.short_string_value()? {
                    Typed::Value(key) => deposed = !key.is_empty(),
                    Typed::Null => deposed = false,
                    Typed::Mismatch => {
                        self.shape(offset, "an instance's deposed key is not a string")
                    }
                }
            } else {
                self.skip_value()?;
            }
        }
        Ok(!deposed)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::parse;

    #[test]
    fn counts_managed_resources_with_a_current_object() {
        let parsed = parse(
            r#"{"version": 4, "resources": [
                {"mode": "managed", "type": "t", "name": "one", "instances": [{"attributes": {"x": [1, {"y": "}"}]}}]},
                {"mode": "managed", "each": "list", "instances": [{"index_key": 0}, {"index_key": 1}, {"index_key": 2}]},
                {"instances": [{"index_key": "a"}, {"index_key": "b"}], "mode": "managed", "each": "map"},
                {"mode": "data", "instances": [{}]},
                {"mode": "managed", "instances": [{"deposed": "00000001"}]},
                {"mode": "managed", "instances": [{"deposed": "00000001"}, {"deposed": ""}]},
                {"mode": "managed", "instances": [{"deposed": null}]},
                {"mode": "managed", "instances": []},
                {"mode": "managed", "module": "module.role", "instances": [{}]}
            ]}"#,
        )
        .unwrap();
        assert_eq!(parsed.managed_resources, 6);
        assert!(parsed.shape.is_none(), "{:?}", parsed.shape);
    }
}
