//! The AMX tile unit as a trait, with a bit-exact software model of the 8 tile registers.
//!
//! The AMX kernel ([`super::amx`]) is written against [`TileUnit`], so its tiling, packing and
//! accumulation run in tests on CPUs without AMX through [`TileModel`]; on AMX hardware the
//! same code drives [`super::amx::HwTiles`].

/// The 64-byte `ldtilecfg` operand (palette 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct TileConfig {
    /// Palette id: 1 = 8 tiles of up to 16 rows × 64 bytes.
    pub palette: u8,
    /// Restart row (0 for a fresh start).
    pub start_row: u8,
    reserved: [u8; 14],
    /// Bytes per row of each tile (≤ 64).
    pub colsb: [u16; 16],
    /// Rows of each tile (≤ 16).
    pub rows: [u8; 16],
}

impl TileConfig {
    /// Palette 1 with every tile in `shapes` given as `(rows, bytes per row)`.
    ///
    /// ```
    /// use codegen::kernels::int8::tile_model::TileConfig;
    /// let cfg = TileConfig::new(&[(16, 64); 8]);
    /// assert_eq!(std::mem::size_of::<TileConfig>(), 64);
    /// assert_eq!(cfg.rows[7], 16);
    /// ```
    pub fn new(shapes: &[(u8, u16)]) -> Self {
        assert!(shapes.len() <= 8, "palette 1 has 8 tiles");
        let mut c = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for (i, &(r, b)) in shapes.iter().enumerate() {
            assert!(
                r <= 16 && b <= 64,
                "tile {i}: {r} rows × {b} bytes exceeds 16×64"
            );
            c.rows[i] = r;
            c.colsb[i] = b;
        }
        c
    }
}

/// The AMX operations the int8 kernel uses. Tile indices are 0..8.
pub trait TileUnit {
    /// `ldtilecfg`.
    fn configure(&mut self, cfg: &TileConfig);
    /// `tileloadd tile, [base + stride·row]`.
    ///
    /// # Safety
    /// `base + r·stride .. + colsb` must be readable for every configured row `r` of `tile`.
    unsafe fn load(&mut self, tile: usize, base: *const u8, stride: usize);
    /// `tilestored [base + stride·row], tile`.
    ///
    /// # Safety
    /// `base + r·stride .. + colsb` must be writable for every configured row `r` of `tile`.
    unsafe fn store(&mut self, tile: usize, base: *mut u8, stride: usize);
    /// `tilezero`.
    fn zero(&mut self, tile: usize);
    /// `tdpbusd c, a, b`: `C[m][n] += Σ_k Σ_t u8 A[m][4k+t] · s8 B[k][4n+t]` (i32, wrapping).
    fn dpbusd(&mut self, c: usize, a: usize, b: usize);
    /// `tdpbssd c, a, b`: as `dpbusd` with s8 A.
    fn dpbssd(&mut self, c: usize, a: usize, b: usize);
    /// `tilerelease`.
    fn release(&mut self);
}

/// Software model: 8 tiles × 16 rows × 64 bytes plus the configuration. Shape rules of the
/// hardware (#UD conditions) are asserted.
#[derive(Debug, Clone)]
pub struct TileModel {
    cfg: Option<TileConfig>,
    tiles: [[[u8; 64]; 16]; 8],
    /// Number of `dpbusd`/`dpbssd` executed (tests use it to check the tiling).
    pub dot_ops: usize,
}

impl Default for TileModel {
    fn default() -> Self {
        Self {
            cfg: None,
            tiles: [[[0; 64]; 16]; 8],
            dot_ops: 0,
        }
    }
}

impl TileModel {
    fn shape(&self, t: usize) -> (usize, usize) {
        let c = self.cfg.as_ref().expect("tile op before ldtilecfg");
        assert!(t < 8, "tile index {t}");
        (c.rows[t] as usize, c.colsb[t] as usize)
    }

    fn i32_at(&self, t: usize, r: usize, n: usize) -> i32 {
        i32::from_le_bytes(
            self.tiles[t][r][4 * n..4 * n + 4]
                .try_into()
                .expect("4 bytes"),
        )
    }

    fn dot(&mut self, c: usize, a: usize, b: usize, a_signed: bool) {
        let (rc, cc) = self.shape(c);
        let (ra, ca) = self.shape(a);
        let (rb, cb) = self.shape(b);
        assert!(
            rc == ra && cc == cb && ca == rb * 4 && c != a && c != b && a != b,
            "tdpb*: incompatible tile shapes"
        );
        self.dot_ops += 1;
        for m in 0..rc {
            for n in 0..cc / 4 {
                let mut acc = self.i32_at(c, m, n);
                for k in 0..ra.min(ca / 4) {
                    for t in 0..4 {
                        let av = self.tiles[a][m][4 * k + t];
                        let av = if a_signed { av as i8 as i32 } else { av as i32 };
                        let bv = self.tiles[b][k][4 * n + t] as i8 as i32;
                        acc = acc.wrapping_add(av * bv);
                    }
                }
                self.tiles[c][m][4 * n..4 * n + 4].copy_from_slice(&acc.to_le_bytes());
            }
        }
    }
}

impl TileUnit for TileModel {
    fn configure(&mut self, cfg: &TileConfig) {
        assert_eq!(cfg.palette, 1, "only palette 1 is modelled");
        self.cfg = Some(*cfg);
        self.tiles = [[[0; 64]; 16]; 8];
    }

    unsafe fn load(&mut self, tile: usize, base: *const u8, stride: usize) {
        let (rows, colsb) = self.shape(tile);
        for r in 0..rows {
            // SAFETY: the caller guarantees `colsb` readable bytes at each configured row.
            let src = unsafe { std::slice::from_raw_parts(base.add(r * stride), colsb) };
            self.tiles[tile][r][..colsb].copy_from_slice(src);
            self.tiles[tile][r][colsb..].fill(0);
        }
        for r in rows..16 {
            self.tiles[tile][r] = [0; 64];
        }
    }

    unsafe fn store(&mut self, tile: usize, base: *mut u8, stride: usize) {
        let (rows, colsb) = self.shape(tile);
        for r in 0..rows {
            // SAFETY: the caller guarantees `colsb` writable bytes at each configured row.
            let dst = unsafe { std::slice::from_raw_parts_mut(base.add(r * stride), colsb) };
            dst.copy_from_slice(&self.tiles[tile][r][..colsb]);
        }
    }

    fn zero(&mut self, tile: usize) {
        self.shape(tile);
        self.tiles[tile] = [[0; 64]; 16];
    }

    fn dpbusd(&mut self, c: usize, a: usize, b: usize) {
        self.dot(c, a, b, false);
    }

    fn dpbssd(&mut self, c: usize, a: usize, b: usize) {
        self.dot(c, a, b, true);
    }

    fn release(&mut self) {
        self.cfg = None;
    }
}
