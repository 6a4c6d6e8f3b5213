"""A study's report: storage and trial files read into tidy tables (collect), judged with analysis/, drawn
(plots), written as report.html, report.md and results.csv (render); and `ablate compare`'s two runs."""
