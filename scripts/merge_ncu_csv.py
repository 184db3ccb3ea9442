"""Merge Nsight Compute raw-page CSVs (one per profiled case: ncu --import R --csv --page raw > CASE.csv)
into one CSV with a leading "case" column (the file's stem). ncu picks each file's units itself (ms in
one, us in another), so each file's units row is kept, as a row whose case is "<stem> units".

    python scripts/merge_ncu_csv.py DIR OUT.csv
"""
import csv
import pathlib
import sys


def main(directory: str, out: str) -> None:
    header, rows = ["case"], []
    for path in sorted(pathlib.Path(directory).glob("*.csv")):
        lines = list(csv.reader(path.open()))
        if len(lines) < 3:             # ncu wrote no kernel (the case failed): its log says why
            continue
        header += [name for name in lines[0] if name not in header]
        rows.append(dict(zip(lines[0], lines[1]), case=f"{path.stem} units"))
        rows += [dict(zip(lines[0], line), case=path.stem) for line in lines[2:]]
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} kernels in {out}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
