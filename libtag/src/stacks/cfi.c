/* cfi.c - call frame information: from a code address to its unwind rule.
 *
 * A module's .eh_frame_hdr holds a table of (function start, FDE) sorted by
 * address; a binary search finds the FDE, whose CIE and instructions (DWARF
 * call frame instructions, as gcc and clang emit them on x86_64) are run up
 * to the address.  What libtag needs from the resulting row is small: how
 * the CFA is found (rsp or rbp plus an offset), that the return address is
 * at CFA - 8, and where rbp was saved (or that it is unchanged).  Anything
 * else - a CFA expression (PLT stubs, the signal trampoline), a CFA in
 * another register (stack realignment) - cannot be cached as such and comes
 * back as TAG_RULE_FP: the walk then tries frame pointers, if they look
 * valid, or ends.
 *
 * Every read goes through a cursor bounded by the PT_LOAD segment that holds
 * .eh_frame_hdr, so damaged or hostile CFI ends the lookup instead of
 * faulting.  No malloc, no locks: async-signal-safe.  Callers hold the
 * module read bracket (_tag_modules_enter) so no dlclose unmaps it meanwhile.
 */
#include <string.h>

#include "stacks/cfi.h"
#include "stacks/modules.h"

/* DWARF pointer encodings (DW_EH_PE_*). */
#define PE_OMIT    0xff
#define PE_ABSPTR  0x00
#define PE_ULEB    0x01
#define PE_UDATA2  0x02
#define PE_UDATA4  0x03
#define PE_UDATA8  0x04
#define PE_SLEB    0x09
#define PE_SDATA2  0x0a
#define PE_SDATA4  0x0b
#define PE_SDATA8  0x0c
#define PE_PCREL   0x10
#define PE_DATAREL 0x30
#define PE_INDIRECT 0x80

/* The machine's DWARF register numbers (base/arch.h): the frame pointer
 * (x86_64's rbp, aarch64's x29), the stack pointer and the return address
 * column (x86_64's 16, aarch64's x30).  The names stay x86_64's. */
#define R_RBP TAG_DW_FP
#define R_RSP TAG_DW_SP
#define R_RA  TAG_DW_RA

struct cursor {
    uintptr_t p, lo, end;
    int bad;
};

static inline uint8_t u8(struct cursor *c)
{
    if (c->bad || c->p < c->lo || c->p + 1 > c->end) {
        c->bad = 1;
        return 0;
    }
    return *(const uint8_t *)c->p++;
}

static inline uint64_t fixed(struct cursor *c, unsigned n)
{
    if (c->bad || c->p < c->lo || c->p + n > c->end || c->p + n < c->p) {
        c->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    memcpy(&v, (const void *)c->p, n);
    c->p += n;
    return v;
}

static uint64_t uleb(struct cursor *c)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        uint8_t b = u8(c);
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return v;
    }
    c->bad = 1;
    return 0;
}

static int64_t sleb(struct cursor *c)
{
    uint64_t v = 0;
    unsigned shift = 0;
    uint8_t b;
    do {
        if (shift >= 64) {
            c->bad = 1;
            return 0;
        }
        b = u8(c);
        v |= (uint64_t)(b & 0x7f) << shift;
        shift += 7;
    } while (b & 0x80);
    if (shift < 64 && (b & 0x40))
        v |= ~0ull << shift;
    return (int64_t)v;
}

/* An encoded pointer; datarel is relative to the .eh_frame_hdr start. */
static uint64_t encoded(struct cursor *c, uint8_t enc, uintptr_t datarel)
{
    if (enc == PE_OMIT)
        return 0;
    uintptr_t at = c->p;
    uint64_t v;
    switch (enc & 0x0f) {
    case PE_ABSPTR: v = fixed(c, 8); break;
    case PE_ULEB:   v = uleb(c); break;
    case PE_UDATA2: v = fixed(c, 2); break;
    case PE_UDATA4: v = fixed(c, 4); break;
    case PE_UDATA8: v = fixed(c, 8); break;
    case PE_SLEB:   v = (uint64_t)sleb(c); break;
    case PE_SDATA2: v = (uint64_t)(int64_t)(int16_t)fixed(c, 2); break;
    case PE_SDATA4: v = (uint64_t)(int64_t)(int32_t)fixed(c, 4); break;
    case PE_SDATA8: v = fixed(c, 8); break;
    default: c->bad = 1; return 0;
    }
    switch (enc & 0x70) {
    case 0: break;
    case PE_PCREL: v += at; break;
    case PE_DATAREL: v += datarel; break;
    default: c->bad = 1; return 0;  /* textrel, funcrel, aligned: not on x86_64 */
    }
    if (enc & PE_INDIRECT)
        c->bad = 1;  /* only personality pointers use it; never needed here */
    return v;
}

/* A register's rule in a CFI row (only rbp and the return address matter). */
enum { REG_SAME = 0, REG_OFFSET, REG_UNDEF, REG_OTHER };
struct row {
    uint8_t cfa_reg;
    uint8_t cfa_expr;
    uint8_t rbp, ra;       /* REG_* */
    int64_t cfa_off;
    int64_t rbp_off, ra_off;
};

struct cie {
    uint64_t code_align;
    int64_t data_align;
    uint64_t ra_reg;
    uint8_t fde_enc;
    uint8_t has_z;
    uintptr_t insns, end;
};

static int parse_cie(uintptr_t at, uintptr_t lo, uintptr_t end, uintptr_t hdr, struct cie *out)
{
    struct cursor c = {at, lo, end, 0};
    uint64_t len = fixed(&c, 4);
    if (len == 0xffffffffu)
        len = fixed(&c, 8);
    uintptr_t start = c.p;
    if (c.bad || len < 4 || len > end - start)
        return 0;
    out->end = start + len;
    c.end = out->end;
    if (fixed(&c, 4) != 0)  /* CIE id in .eh_frame */
        return 0;
    uint8_t version = u8(&c);
    if (version != 1 && version != 3)
        return 0;
    char aug[8];
    unsigned n = 0;
    for (;;) {
        uint8_t ch = u8(&c);
        if (c.bad || n >= sizeof aug)
            return 0;
        aug[n++] = (char)ch;
        if (!ch)
            break;
    }
    if (aug[0] == 'e' && aug[1] == 'h')
        fixed(&c, 8);  /* old gcc "eh" data */
    out->code_align = uleb(&c);
    out->data_align = sleb(&c);
    out->ra_reg = version == 1 ? u8(&c) : uleb(&c);
    out->fde_enc = PE_ABSPTR;
    out->has_z = aug[0] == 'z';
    if (out->has_z) {
        uint64_t alen = uleb(&c);
        uintptr_t aend = c.p + alen;
        for (unsigned i = 1; aug[i] && !c.bad; i++) {
            switch (aug[i]) {
            case 'R': out->fde_enc = u8(&c); break;
            case 'L': u8(&c); break;
            case 'P': {
                uint8_t penc = u8(&c);
                /* the personality pointer itself is not followed: only
                 * its size matters, and indirect is a flag on top */
                encoded(&c, penc & 0x7f, hdr);
                break;
            }
            case 'S': case 'B': case 'G': break;
            default: i = sizeof aug - 1; break;  /* unknown: skip the rest */
            }
        }
        c.p = aend;
    }
    out->insns = c.p;
    return !c.bad && out->insns <= out->end && out->code_align != 0;
}

/* The rules of rbp and the return address when register reg gets one
 * libtag cannot use (REG_UNDEF, REG_SAME, REG_OTHER): as_rbp, as_ra. */
static inline void reg_rule(struct row *r, uint64_t reg, uint8_t as_rbp, uint8_t as_ra)
{
    if (reg == R_RBP) r->rbp = as_rbp;
    if (reg == R_RA) r->ra = as_ra;
}

/* The rows remember_state saved, for restore_state. */
struct saved_rows {
    struct row row[8];
    unsigned n;
};

/* Apply CFI instruction op (its operands read from c), one that changes
 * the row, not the location, to r.  init: the CIE's row, for
 * DW_CFA_restore (NULL inside the CIE).  Returns 0 on a malformed or
 * unsupported instruction. */
static int apply(struct cursor *c, const struct cie *cie, uint8_t op, struct row *r,
                 const struct row *init, struct saved_rows *st)
{
    uint64_t reg;
    int64_t off;
    switch (op >> 6) {
    case 2:  /* DW_CFA_offset */
        reg = op & 0x3f;
        off = (int64_t)uleb(c) * cie->data_align;
        goto set_offset;
    case 3:  /* DW_CFA_restore */
        reg = op & 0x3f;
        goto restore;
    }
    switch (op) {
    case 0x00: break;                              /* nop */
    case 0x05:                                     /* offset_extended */
        reg = uleb(c);
        off = (int64_t)uleb(c) * cie->data_align;
        goto set_offset;
    case 0x06: reg = uleb(c); goto restore;        /* restore_extended */
    case 0x07: reg_rule(r, uleb(c), REG_UNDEF, REG_UNDEF); break;  /* undefined */
    case 0x08: reg_rule(r, uleb(c), REG_SAME, REG_OTHER); break;   /* same_value */
    case 0x09:                                     /* register */
        reg = uleb(c);
        uleb(c);
        reg_rule(r, reg, REG_OTHER, REG_OTHER);
        break;
    case 0x0a:                                     /* remember_state */
        if (st->n == sizeof st->row / sizeof st->row[0])
            return 0;
        st->row[st->n++] = *r;
        break;
    case 0x0b:                                     /* restore_state */
        if (st->n == 0)
            return 0;
        /* the CFA is part of the state too (DWARF 5 6.4.2.4) */
        *r = st->row[--st->n];
        break;
    case 0x0c:                                     /* def_cfa */
        r->cfa_reg = (uint8_t)uleb(c);
        r->cfa_off = (int64_t)uleb(c);
        r->cfa_expr = 0;
        break;
    case 0x0d:                                     /* def_cfa_register */
        r->cfa_reg = (uint8_t)uleb(c);
        r->cfa_expr = 0;
        break;
    case 0x0e: r->cfa_off = (int64_t)uleb(c); break;  /* def_cfa_offset */
    case 0x0f:                                     /* def_cfa_expression */
        r->cfa_expr = 1;
        c->p += uleb(c);
        break;
    case 0x10:                                     /* expression */
    case 0x16:                                     /* val_expression */
        reg = uleb(c);
        c->p += uleb(c);
        reg_rule(r, reg, REG_OTHER, REG_OTHER);
        break;
    case 0x11:                                     /* offset_extended_sf */
        reg = uleb(c);
        off = sleb(c) * cie->data_align;
        goto set_offset;
    case 0x12:                                     /* def_cfa_sf */
        r->cfa_reg = (uint8_t)uleb(c);
        r->cfa_off = sleb(c) * cie->data_align;
        r->cfa_expr = 0;
        break;
    case 0x13: r->cfa_off = sleb(c) * cie->data_align; break;  /* def_cfa_offset_sf */
    case 0x14:                                     /* val_offset */
    case 0x15:                                     /* val_offset_sf */
        reg = uleb(c);
        if (op == 0x14) uleb(c); else sleb(c);
        reg_rule(r, reg, REG_OTHER, REG_OTHER);
        break;
    case 0x2e: uleb(c); break;                     /* GNU_args_size */
#ifdef __aarch64__
    case 0x2d: break;  /* AARCH64_negate_ra_state: pac-ret signs x30; the walk strips it */
#endif
    case 0x2f:                                     /* GNU_negative_offset_extended */
        reg = uleb(c);
        off = -(int64_t)uleb(c) * cie->data_align;
        goto set_offset;
    default:
        return 0;
    }
    return 1;
set_offset:
    if (reg == R_RBP) { r->rbp = REG_OFFSET; r->rbp_off = off; }
    if (reg == R_RA)  { r->ra = REG_OFFSET; r->ra_off = off; }
    return 1;
restore:
    if (!init)
        return 0;  /* DW_CFA_restore inside a CIE */
    if (reg == R_RBP) { r->rbp = init->rbp; r->rbp_off = init->rbp_off; }
    if (reg == R_RA)  { r->ra = init->ra; r->ra_off = init->ra_off; }
    return 1;
}

/* Run CFI instructions [c->p, c->end) starting at address loc, stopping
 * before the first row that starts past target: the instructions that
 * move the location are taken here, the others change the row (apply).
 * init: the CIE's row, for DW_CFA_restore.  Returns 0 on a malformed or
 * unsupported stream. */
static int run(struct cursor *c, const struct cie *cie, uint64_t loc, uint64_t target,
               struct row *r, const struct row *init)
{
    struct saved_rows st;
    st.n = 0;
    while (c->p < c->end && !c->bad) {
        uint8_t op = u8(c);
        uint64_t delta;
        if (op >> 6 == 1) {                            /* advance_loc */
            delta = op & 0x3f;
        } else if (op == 0x01) {                       /* set_loc */
            loc = encoded(c, cie->fde_enc, 0);
            if (loc > target)
                return 1;
            continue;
        } else if (op == 0x02) {                       /* advance_loc1 */
            delta = u8(c);
        } else if (op == 0x03) {                       /* advance_loc2 */
            delta = fixed(c, 2);
        } else if (op == 0x04) {                       /* advance_loc4 */
            delta = fixed(c, 4);
        } else {
            if (!apply(c, cie, op, r, init, &st))
                return 0;
            continue;
        }
        loc += delta * cie->code_align;
        if (loc > target)
            return !c->bad;
    }
    return !c->bad;
}

/* The FDE covering addr, by binary search of the .eh_frame_hdr table.
 * Only the table encoding every linker writes (datarel sdata4) is
 * searched; another gives no FDE. */
static uintptr_t find_fde(const struct tag_module *m, uintptr_t addr)
{
    uintptr_t hdr = m->eh_hdr;
    struct cursor c = {hdr, m->data_lo, m->data_hi, 0};
    uint8_t version = u8(&c), ptr_enc = u8(&c), count_enc = u8(&c), table_enc = u8(&c);
    if (c.bad || version != 1 || table_enc != (PE_DATAREL | PE_SDATA4))
        return 0;
    encoded(&c, ptr_enc, hdr);
    uint64_t n = encoded(&c, count_enc, hdr);
    uintptr_t table = c.p;
    if (c.bad || n == 0 || n > (m->data_hi - table) / 8)
        return 0;
    const int32_t *t = (const int32_t *)table;
    if ((uintptr_t)t & 3)
        return 0;
    int64_t want = (int64_t)(addr - hdr);
    uint64_t lo = 0, hi = n;
    if (t[0] > want)
        return 0;
    while (hi - lo > 1) {  /* largest entry whose start <= addr */
        uint64_t mid = (lo + hi) / 2;
        if (t[2 * mid] <= want)
            lo = mid;
        else
            hi = mid;
    }
    return hdr + (intptr_t)t[2 * lo + 1];
}

uint64_t _tag_cfi_rule(const struct tag_module *m, uintptr_t addr)
{
    if (!m->eh_hdr)
        return TAG_RULE_FP;
    uintptr_t fde = find_fde(m, addr);
    if (!fde)
        return TAG_RULE_FP;
    struct cursor c = {fde, m->data_lo, m->data_hi, 0};
    uint64_t len = fixed(&c, 4);
    if (len == 0xffffffffu)
        len = fixed(&c, 8);
    uintptr_t start = c.p;
    if (c.bad || len < 8 || len > m->data_hi - start)
        return TAG_RULE_FP;
    c.end = start + len;
    uintptr_t id_at = c.p;
    uint32_t cie_off = (uint32_t)fixed(&c, 4);
    if (cie_off == 0 || cie_off > id_at - m->data_lo)
        return TAG_RULE_FP;
    struct cie cie;
    if (!parse_cie(id_at - cie_off, m->data_lo, m->data_hi, m->eh_hdr, &cie) ||
        cie.ra_reg != R_RA)
        return TAG_RULE_FP;
    uint64_t begin = encoded(&c, cie.fde_enc, m->eh_hdr);
    uint64_t range = encoded(&c, cie.fde_enc & 0x0f, m->eh_hdr);
    if (c.bad || addr < begin || addr - begin >= range)
        return TAG_RULE_FP;  /* a gap in the table: code without CFI */
    if (cie.has_z)
        c.p += uleb(&c);

#ifdef __aarch64__
    struct row init = {.cfa_reg = R_RSP, .cfa_off = 0, .rbp = REG_SAME, .ra = REG_SAME};
#else
    struct row init = {.cfa_reg = R_RSP, .cfa_off = 8, .rbp = REG_SAME, .ra = REG_SAME};
#endif
    struct cursor ci = {cie.insns, m->data_lo, cie.end, 0};
    if (!run(&ci, &cie, 0, UINT64_MAX, &init, NULL))
        return TAG_RULE_FP;
    struct row r = init;
    if (!run(&c, &cie, begin, addr, &r, &init))
        return TAG_RULE_FP;

    if (r.ra == REG_UNDEF)
        return TAG_RULE_END;  /* _start, clone: the outermost frame */
#ifdef __aarch64__
    /* aarch64: the return address in x30 (unchanged: a leaf, a prologue
     * before it saves it) or saved in a slot below the CFA (a frame
     * record: stp x29, x30 - not always at CFA - 8 as on x86_64) */
    if (r.cfa_expr || (r.cfa_reg != R_RSP && r.cfa_reg != R_RBP) || r.cfa_off < 0 ||
        r.cfa_off > (int64_t)TAG_RULE_OFF_MASK)
        return TAG_RULE_FP;
    uint64_t rule = TAG_RULE_CFA | (uint64_t)r.cfa_off << TAG_RULE_OFF_SHIFT;
    if (r.cfa_reg == R_RBP)
        rule |= TAG_RULE_CFA_RBP;
    if (r.ra == REG_SAME) {
        rule |= TAG_RULE_RA_LR;
    } else if (r.ra == REG_OFFSET && r.ra_off < 0 && !(r.ra_off & 7) &&
               -r.ra_off / 8 <= (int64_t)TAG_RULE_RA_MASK) {
        rule |= (uint64_t)(-r.ra_off / 8) << TAG_RULE_RA_SHIFT;
    } else {
        return TAG_RULE_FP;
    }
#else
    if (r.cfa_expr || (r.cfa_reg != R_RSP && r.cfa_reg != R_RBP) || r.ra != REG_OFFSET ||
        r.ra_off != -8 || r.cfa_off < 8 || r.cfa_off >= (1 << 24))
        return TAG_RULE_FP;
    uint64_t rule = TAG_RULE_CFA | (uint64_t)r.cfa_off << TAG_RULE_OFF_SHIFT;
    if (r.cfa_reg == R_RBP)
        rule |= TAG_RULE_CFA_RBP;
#endif
    if (r.rbp == REG_OFFSET) {
        if (r.rbp_off >= 0 || (r.rbp_off & 7) || -r.rbp_off / 8 >= 0x10000)
            rule |= TAG_RULE_RBP_LOST;
        else
            rule |= TAG_RULE_RBP_SAVED | (uint64_t)(-r.rbp_off / 8) << TAG_RULE_SLOT_SHIFT;
    } else if (r.rbp != REG_SAME) {
        rule |= TAG_RULE_RBP_LOST;
    }
    return rule;
}
