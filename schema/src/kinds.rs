//! The kinds of what a trace records, as Rust enums: the one place the Rust side declares them.
//! Each mirrors the `trace.fbs` enum of the same name (same values: converting is a cast), and
//! carries its stable name, the string `info`, the exports and every JSON output use (part of
//! the JSON contract: a name changes only with a new major version). The recorder, the
//! analyzer, the C ABI and the Python module all take them from here; a binding that gets a
//! kind as a number converts it with `TryFrom<u8>`, which refuses what the format does not
//! know.
//!
//! Adding a kind: add it to the schema (`trace.fbs`, then `regen.sh`) and to the list here.

use crate::fb;

macro_rules! kinds {
    (
        $(#[$meta:meta])*
        $name:ident ($fb:ident) {
            $($(#[$vmeta:meta])* $variant:ident = $value:literal, $text:literal;)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum $name {
            $($(#[$vmeta])* $variant = $value,)*
        }

        impl $name {
            /// Every kind, in the order of their values.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The stable name outputs use.
            pub const fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }
        }

        impl From<$name> for fb::$fb {
            #[inline(always)]
            fn from(k: $name) -> fb::$fb {
                fb::$fb(k as u8)
            }
        }

        impl TryFrom<u8> for $name {
            type Error = u8;

            /// The kind of a value as stored; the value back when the format knows no such
            /// kind (a newer writer's, or damage).
            #[inline]
            fn try_from(v: u8) -> Result<$name, u8> {
                match v {
                    $($value => Ok($name::$variant),)*
                    other => Err(other),
                }
            }
        }

        impl TryFrom<fb::$fb> for $name {
            type Error = u8;

            #[inline]
            fn try_from(k: fb::$fb) -> Result<$name, u8> {
                $name::try_from(k.0)
            }
        }
    };
}

kinds! {
    /// What a memory event says happened (`MemEvent.kind`). The rebase record, which moves a
    /// chunk's time base, is not an event and not among these.
    MemKind (MemKind) {
        /// A request to the allocator (`bytes` asked).
        MallocPre = 0, "malloc_pre";
        /// The answer to a request: `ptr` (0 when it failed), the bytes asked, the block's id.
        MallocPost = 1, "malloc_post";
        /// The allocator asks the device for memory (a cache miss).
        AllocPre = 2, "alloc_pre";
        /// The device's answer: `ptr` (0 when it failed) and the bytes acquired.
        AllocPost = 3, "alloc_post";
        /// A block goes back to the allocator.
        FreePre = 4, "free_pre";
        FreePost = 5, "free_post";
        /// The allocator returned `bytes` of cached memory to the device.
        Release = 6, "release";
        /// A request failed for lack of memory: `bytes` asked, `ptr` the bytes held.
        OutOfMemory = 7, "out_of_memory";
        /// The allocator's limit was set to `bytes` (0 = none).
        LimitSet = 8, "limit_set";
        /// Format 1.5: the free of the block at `ptr` (`bytes`) was requested; the allocator
        /// keeps it until other streams are done with it, and its `FreePost` follows.
        FreeRequested = 10, "free_requested";
        /// Format 1.6: the block at `ptr` (`bytes` its size) now belongs to `stack`, its live
        /// bytes unchanged (a tensor became a gradient, an optimizer's state): live views move
        /// it, cumulative figures keep it where it was made.
        Relabel = 11, "relabel";
    }
}

kinds! {
    /// A rare event with an absolute timestamp (`MarkEvent.kind`).
    MarkKind (MarkKind) {
        /// `aux` = epoch number, `a` = CPU bytes in use.
        EpochBegin = 0, "epoch_begin";
        /// `aux` = epoch number, `a` = CPU bytes in use, `b` = CPU peak bytes since the begin.
        EpochEnd = 1, "epoch_end";
        /// `a` = CPU bytes in use.
        CpuSample = 2, "cpu_sample";
        /// A scope closed by an exception, not a completed call: `aux` = its stack, `a` = the
        /// ticks it opened at.
        ScopeAbort = 3, "scope_abort";
        /// Format 1.5: at an out-of-memory, `aux` = device, `a` = bytes the device reported
        /// free, `b` = bytes requested.
        DeviceFree = 4, "device_free";
        /// Format 1.5: the allocator took a snapshot of its state; `aux` = device.
        Snapshot = 5, "snapshot";
        /// Format 1.5: a note: `aux` = string id of its text, `a` = address (0: none), `b` =
        /// device.
        Annotation = 6, "annotation";
    }
}

kinds! {
    /// What opened a frame of an interned stack (`FrameDef.kind`).
    FrameKind (FrameKind) {
        /// An allocation's call site (`file:line`, named after the innermost open scope).
        Site = 0, "site";
        /// A function scope (a Chainer `FunctionNode` call).
        Function = 1, "function";
        /// A link scope (a Chainer `Link` call).
        Link = 2, "link";
        /// A user scope.
        Scope = 3, "scope";
        /// A frame handed in by a foreign caller (a line of a Python traceback).
        Foreign = 4, "foreign";
        /// A label under an allocation's stack, never a scope: a memory category (1.4).
        Label = 5, "label";
    }
}

kinds! {
    /// What memory a device's events are about (`DeviceDef.kind`, 1.4).
    DeviceKind (DeviceKind) {
        /// Not said (older files, a pool's simulated host device): a GPU pool.
        Unspecified = 0, "unspecified";
        Gpu = 1, "gpu";
        Cpu = 2, "cpu";
    }
}

kinds! {
    /// Whether a function scope is the forward or the backward computation; reports split by
    /// it as Chainer's `CupyMemoryProfileHook` does. `None` for everything that is neither.
    Phase (Phase) {
        None = 0, "none";
        Forward = 1, "forward";
        Backward = 2, "backward";
    }
}

/// The kinds of scope a caller can open: the [`FrameKind`]s of scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScopeKind {
    Function,
    Link,
    Scope,
}

impl ScopeKind {
    pub const ALL: &'static [ScopeKind] = &[ScopeKind::Function, ScopeKind::Link, ScopeKind::Scope];
}

impl From<ScopeKind> for FrameKind {
    fn from(k: ScopeKind) -> FrameKind {
        match k {
            ScopeKind::Function => FrameKind::Function,
            ScopeKind::Link => FrameKind::Link,
            ScopeKind::Scope => FrameKind::Scope,
        }
    }
}

impl TryFrom<FrameKind> for ScopeKind {
    type Error = FrameKind;

    fn try_from(k: FrameKind) -> Result<ScopeKind, FrameKind> {
        match k {
            FrameKind::Function => Ok(ScopeKind::Function),
            FrameKind::Link => Ok(ScopeKind::Link),
            FrameKind::Scope => Ok(ScopeKind::Scope),
            other => Err(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conversions are casts: they hold only while the values match the schema's. A kind
    /// the schema has and this list lacks is caught too (its value converts to nothing here).
    #[test]
    fn values_and_names_match_the_schema() {
        for k in MemKind::ALL {
            let theirs = fb::MemKind::from(*k);
            assert_eq!(
                theirs.variant_name().map(str::to_lowercase),
                Some(k.name().replace('_', ""))
            );
        }
        for v in fb::MemKind::ENUM_VALUES {
            assert!(
                *v == fb::MemKind::Rebase || MemKind::try_from(*v).is_ok(),
                "{v:?}"
            );
        }
        for k in MarkKind::ALL {
            let theirs = fb::MarkKind::from(*k);
            assert_eq!(
                theirs.variant_name().map(str::to_lowercase),
                Some(k.name().replace('_', ""))
            );
        }
        for v in fb::MarkKind::ENUM_VALUES {
            assert!(MarkKind::try_from(*v).is_ok(), "{v:?}");
        }
        for k in FrameKind::ALL {
            let theirs = fb::FrameKind::from(*k);
            assert_eq!(
                theirs.variant_name().map(str::to_lowercase),
                Some(k.name().to_string())
            );
        }
        for v in fb::FrameKind::ENUM_VALUES {
            assert!(FrameKind::try_from(*v).is_ok(), "{v:?}");
        }
        for k in DeviceKind::ALL {
            let theirs = fb::DeviceKind::from(*k);
            assert_eq!(
                theirs.variant_name().map(str::to_lowercase),
                Some(k.name().to_string())
            );
        }
        for v in fb::DeviceKind::ENUM_VALUES {
            assert!(DeviceKind::try_from(*v).is_ok(), "{v:?}");
        }
        for k in Phase::ALL {
            let theirs = fb::Phase::from(*k);
            assert_eq!(
                theirs.variant_name().map(str::to_lowercase),
                Some(k.name().to_string())
            );
        }
        assert_eq!(
            MemKind::try_from(9),
            Err(9),
            "the rebase record is no event"
        );
        assert_eq!(MemKind::try_from(12), Err(12));
        for s in ScopeKind::ALL {
            assert_eq!(ScopeKind::try_from(FrameKind::from(*s)), Ok(*s));
        }
    }
}
