// model_ops_gather.wgsl — out[r] = table[ids[r]]: the token embedding, and `gather_rows`
// (the same kernel with the activations as the table).
//
// Algorithm: one thread per (output row r, VT column c); a copy, no arithmetic. An index
// outside [0, rows) — data only the caller knows, never checked on the host — gives a row
// of zeros: the table is never read outside its `rows` rows.
//
// Specialisation (generated header): WG, V / VT (V = 4 when H % 4 == 0).
//
// Layout: table [rows, H] f32 row-major; ids [T] i32; out [T, H] f32; Params.hv = H / V.
// Bounds relied on (host checks): T·H < 2^32 and rows·H < 2^32 elements (both tensors fit
// one storage binding), rows ≤ the table's rows, H > 0; workgroups spread over x and z.

struct Params {
    num_rows: u32,
    hv: u32,
    table_rows: u32,
    pad0: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> table: array<VT>;
@group(0) @binding(2) var<storage, read> ids: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<VT>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let u = flat_group(wid, nwg) * WG + lid;
    if u >= params.num_rows * params.hv {
        return;
    }
    let r = u / params.hv;
    let c = u % params.hv;
    let id = ids[r];
    var v = VT(0.0);
    if id >= 0 && u32(id) < params.table_rows {
        v = table[u32(id) * params.hv + c];
    }
    out[u] = v;
}
