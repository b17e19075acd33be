//! Property tests of the SSRF address classifier (issue 7):
//! [`special_range`] against std's own `Ipv4Addr`/`Ipv6Addr` predicates and
//! the extra ranges of SPEC §3, and every IPv6 form embedding an IPv4 address.
//!
//! Any address std calls special must be refused; mapped, compatible, NAT64,
//! 6to4 and Teredo forms of a refused IPv4 address must be refused; and a
//! refused IPv4 address is refused by `check_url` however its URL spells it.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use wharf_proxy::destination::{parse_target, special_range, DestinationPolicy};

/// IPv4 blocks that must be refused (IANA special-purpose registry, SPEC §3),
/// written out independently of the classifier's own table.
const REFUSED_V4: &[(u32, u8)] = &[
    (0x0000_0000, 8),  // 0/8 "this network" (0.0.0.0 unspecified)
    (0x0a00_0000, 8),  // 10/8 private
    (0x6440_0000, 10), // 100.64/10 CGNAT (shared address space)
    (0x7f00_0000, 8),  // 127/8 loopback
    (0xa9fe_0000, 16), // 169.254/16 link-local
    (0xac10_0000, 12), // 172.16/12 private
    (0xc000_0000, 24), // 192.0.0/24 IETF protocol assignments
    (0xc000_0200, 24), // 192.0.2/24 TEST-NET-1
    (0xc058_6300, 24), // 192.88.99/24 6to4 relay anycast
    (0xc0a8_0000, 16), // 192.168/16 private
    (0xc612_0000, 15), // 198.18/15 benchmarking
    (0xc633_6400, 24), // 198.51.100/24 TEST-NET-2
    (0xcb00_7100, 24), // 203.0.113/24 TEST-NET-3
    (0xe000_0000, 4),  // 224/4 multicast
    (0xf000_0000, 4),  // 240/4 reserved, 255.255.255.255 broadcast
];

fn in_block(ip: u32, (net, len): (u32, u8)) -> bool {
    len == 0 || ip >> (32 - u32::from(len)) == net >> (32 - u32::from(len))
}

fn listed_v4(ip: Ipv4Addr) -> bool {
    REFUSED_V4
        .iter()
        .any(|block| in_block(u32::from(ip), *block))
}

/// An IPv4 address inside one of the refused blocks.
fn refused_v4() -> impl Strategy<Value = Ipv4Addr> {
    (0..REFUSED_V4.len(), any::<u32>()).prop_map(|(i, host)| {
        let (net, len) = REFUSED_V4[i];
        let mask = if len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(len))
        };
        Ipv4Addr::from((net & mask) | (host & !mask))
    })
}

/// Any IPv4 address, half of them drawn from inside a refused block so the
/// interesting ranges are well covered.
fn any_v4() -> impl Strategy<Value = Ipv4Addr> {
    prop_oneof![any::<u32>().prop_map(Ipv4Addr::from), refused_v4()]
}

/// Any IPv6 address, many of them in special blocks.
fn any_v6() -> impl Strategy<Value = Ipv6Addr> {
    let with_prefix = |prefix: u128, len: u32| {
        any::<u128>().prop_map(move |host| {
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            Ipv6Addr::from((prefix & mask) | (host & !mask))
        })
    };
    prop_oneof![
        any::<u128>().prop_map(Ipv6Addr::from),
        with_prefix(0, 96),                      // ::/96 compatible, ::, ::1
        with_prefix(0xffff_0000_0000, 96),       // ::ffff:0:0/96 mapped
        with_prefix(0x0064_ff9b_u128 << 96, 96), // 64:ff9b::/96 NAT64
        with_prefix(0x2002_u128 << 112, 16),     // 6to4
        with_prefix(0x2001_0000_u128 << 96, 32), // Teredo
        with_prefix(0xfc00_u128 << 112, 7),      // unique-local
        with_prefix(0xfe80_u128 << 112, 10),     // link-local
        with_prefix(0xff00_u128 << 112, 8),      // multicast
        with_prefix(0x2001_0db8_u128 << 96, 32), // documentation
        with_prefix(0x2000_u128 << 112, 3),      // global unicast
    ]
}

fn v4_in(ip: Ipv4Addr) -> (u16, u16) {
    let [a, b, c, d] = ip.octets();
    (u16::from_be_bytes([a, b]), u16::from_be_bytes([c, d]))
}

fn nat64(ip: Ipv4Addr) -> Ipv6Addr {
    let (hi, lo) = v4_in(ip);
    Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo)
}

fn six_to_four(ip: Ipv4Addr, subnet: u16, iid: u64) -> Ipv6Addr {
    let (hi, lo) = v4_in(ip);
    let iid = iid.to_be_bytes();
    let word = |i: usize| u16::from_be_bytes([iid[i], iid[i + 1]]);
    Ipv6Addr::new(0x2002, hi, lo, subnet, word(0), word(2), word(4), word(6))
}

/// Teredo: server IPv4 in bits 32..64, client IPv4 bit-inverted in the last 32.
fn teredo(server: Ipv4Addr, client: Ipv4Addr, flags: u16, port: u16) -> Ipv6Addr {
    let (s_hi, s_lo) = v4_in(server);
    let (c_hi, c_lo) = v4_in(client);
    Ipv6Addr::new(0x2001, 0, s_hi, s_lo, flags, !port, !c_hi, !c_lo)
}

fn refused(ip: impl Into<IpAddr>) -> bool {
    special_range(ip.into()).is_some()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2048,
        // No regression files: a failure prints its minimal input.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Whatever std's stable predicates call special is refused.
    #[test]
    fn ipv4_that_std_calls_special_is_refused(ip in any_v4()) {
        let special = ip.is_loopback()
            || ip.is_private()
            || ip.is_link_local()
            || ip.is_multicast()
            || ip.is_unspecified()
            || ip.is_broadcast()
            || ip.is_documentation();
        if special {
            prop_assert!(refused(ip), "{ip} is special for std, yet allowed");
        }
    }

    /// The classifier refuses exactly the listed blocks: CGNAT, benchmarking,
    /// 0/8, 240/4 and the rest included, and nothing public.
    #[test]
    fn ipv4_is_refused_exactly_in_the_special_blocks(ip in any_v4()) {
        prop_assert_eq!(refused(ip), listed_v4(ip), "{} ({:?})", ip, special_range(ip.into()));
    }

    #[test]
    fn ipv6_that_std_calls_special_is_refused(ip in any_v6()) {
        let special = ip.is_loopback()
            || ip.is_multicast()
            || ip.is_unspecified()
            || ip.is_unique_local()
            || ip.is_unicast_link_local();
        if special {
            prop_assert!(refused(ip), "{ip} is special for std, yet allowed");
        }
    }

    /// SPEC §3's IPv6 blocks: unique-local, Teredo, IPv4-compatible and
    /// everything outside global unicast 2000::/3 are refused whatever they hold.
    #[test]
    fn ipv6_special_blocks_are_refused(ip in any_v6()) {
        let bits = u128::from(ip);
        let segments = ip.segments();
        let unique_local = bits >> 121 == 0xfc >> 1;
        let teredo = segments[0] == 0x2001 && segments[1] == 0;
        let documentation = segments[0] == 0x2001 && segments[1] == 0x0db8;
        let compatible = segments[..6] == [0; 6];
        let outside_global = bits >> 125 != 1 && ip.to_ipv4_mapped().is_none()
            && segments[..6] != [0x64, 0xff9b, 0, 0, 0, 0];
        if unique_local || teredo || documentation || compatible || outside_global {
            prop_assert!(refused(ip), "{ip} allowed");
        }
    }

    /// Every IPv6 form that embeds a refused IPv4 address is refused; the
    /// mapped, NAT64 and 6to4 forms of a public one are not (they reach it).
    #[test]
    fn embedded_ipv4_forms_follow_the_ipv4_address(
        ip in any_v4(),
        subnet in any::<u16>(),
        iid in any::<u64>(),
        server in any::<u32>(),
        flags in any::<u16>(),
        port in any::<u16>(),
    ) {
        let forms = [
            ("mapped", ip.to_ipv6_mapped()),
            ("nat64", nat64(ip)),
            ("6to4", six_to_four(ip, subnet, iid)),
        ];
        for (form, v6) in forms {
            prop_assert_eq!(refused(v6), refused(ip), "{} form {} of {}", form, v6, ip);
        }
        // Compatible (deprecated) and Teredo forms are refused outright.
        prop_assert!(refused(ip.to_ipv6_compatible()), "{}", ip.to_ipv6_compatible());
        let teredo = teredo(Ipv4Addr::from(server), ip, flags, port);
        prop_assert!(refused(teredo), "{}", teredo);
    }

    /// A refused IPv4 address is refused by `check_url` in every spelling the
    /// WHATWG parser accepts: dotted, decimal, hex, octal, short, IPv6-mapped.
    #[test]
    fn every_spelling_of_a_refused_ipv4_url_is_refused(ip in refused_v4(), port in 1u16..) {
        let [a, b, c, d] = ip.octets();
        let n = u32::from(ip);
        let (hi, lo) = v4_in(ip);
        let spellings = [
            format!("{ip}"),
            format!("{ip}."),
            format!("{n}"),
            format!("0x{n:x}"),
            format!("0X{n:08X}"),
            format!("0{n:o}"),
            format!("0{a:o}.0{b:o}.0{c:o}.0{d:o}"),
            format!("0x{a:x}.0x{b:x}.0x{c:x}.0x{d:x}"),
            format!("{a}.{}", (u32::from(b) << 16) | (u32::from(c) << 8) | u32::from(d)),
            format!("{a}.{b}.{}", (u32::from(c) << 8) | u32::from(d)),
            format!("[::ffff:{ip}]"),
            format!("[::ffff:{hi:x}:{lo:x}]"),
            format!("[0:0:0:0:0:ffff:{ip}]"),
            format!("[64:ff9b::{ip}]"),
            format!("[::{ip}]"),
        ];
        let strict = DestinationPolicy::new(false, &[]);
        for host in spellings {
            for raw in [format!("http://{host}/"), format!("https://{host}:{port}/x?y")] {
                let url = parse_target(&raw).unwrap_or_else(|e| panic!("{raw}: {e}"));
                prop_assert!(strict.check_url(&url).is_err(), "{} ({}) allowed", raw, url);
            }
        }
    }
}
