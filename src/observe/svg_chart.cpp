#include "observe/svg_chart.hpp"

#include <array>
#include <cmath>
#include <cstdio>

#include "observe/report_text.hpp"

namespace zerowait::observe {

double LinearScale::operator()(double value) const {
  const double span = domain_hi - domain_lo;
  if (!(span > 0)) return range_lo;
  return range_lo + (value - domain_lo) / span * (range_hi - range_lo);
}

namespace {

// The round step (1, 2 or 5 x 10^k) that cuts `span` into about `count` parts.
double nice_step(double span, int count) {
  const double raw = span / std::max(count, 1);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double factor : {1.0, 2.0, 5.0}) {
    if (factor * power >= raw) return factor * power;
  }
  return 10 * power;
}

std::vector<double> ticks_at(double lo, double hi, double step) {
  std::vector<double> ticks;
  // A hair of slack so a tick that lands on hi through rounding is kept.
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    ticks.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  }
  return ticks;
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int count) {
  if (!(hi > lo)) return {};
  return ticks_at(lo, hi, nice_step(hi - lo, count));
}

double nice_ceiling(double value) {
  if (!(value > 0)) return 1;
  const double power = std::pow(10.0, std::floor(std::log10(value)));
  for (double factor : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (factor * power >= value * (1 - 1e-12)) return factor * power;
  }
  return 10 * power;
}

std::vector<double> time_ticks(double lo, double hi, int count) {
  if (!(hi > lo)) return {};
  const double raw = (hi - lo) / std::max(count, 1);
  if (raw < 45) return ticks_at(lo, hi, nice_step(hi - lo, count));
  // Minutes and hours read best at the steps a clock has.
  constexpr std::array<double, 12> kSteps = {60,   120,  300,   600,   900,   1800,
                                             3600, 7200, 10800, 21600, 43200, 86400};
  for (double step : kSteps) {
    if (step >= raw) return ticks_at(lo, hi, step);
  }
  return ticks_at(lo, hi, nice_step(hi - lo, count));
}

std::string time_label(double seconds) {
  const long long whole = std::llround(seconds);
  if (std::fabs(seconds) < 60) {
    if (std::fabs(seconds - static_cast<double>(whole)) < 1e-6) {
      return std::to_string(whole) + " s";
    }
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%g s", seconds);
    return buffer;
  }
  char buffer[32];
  if (whole < 3600) {
    std::snprintf(buffer, sizeof buffer, "%lld:%02lld", whole / 60, whole % 60);
  } else {
    std::snprintf(buffer, sizeof buffer, "%lld:%02lld:%02lld", whole / 3600, whole / 60 % 60,
                  whole % 60);
  }
  return buffer;
}

SvgCanvas::SvgCanvas(const Frame& frame, const std::string& title, const std::string& css_class)
    : frame_(frame), title_(title), css_class_(css_class) {}

void SvgCanvas::rect(double x, double y, double width, double height, const std::string& fill,
                     const std::string& css_class, const std::string& tooltip) {
  body_ += "<rect class=\"" + css_class + "\" x=\"" + svg_number(x) + "\" y=\"" + svg_number(y) +
           "\" width=\"" + svg_number(width) + "\" height=\"" + svg_number(height) +
           "\" fill=\"" + fill + "\"";
  if (tooltip.empty()) {
    body_ += "/>";
  } else {
    body_ += "><title>" + html_escape(tooltip) + "</title></rect>";
  }
}

void SvgCanvas::line(double x1, double y1, double x2, double y2, const std::string& stroke,
                     const std::string& css_class, bool dashed) {
  body_ += "<line class=\"" + css_class + "\" x1=\"" + svg_number(x1) + "\" y1=\"" +
           svg_number(y1) + "\" x2=\"" + svg_number(x2) + "\" y2=\"" + svg_number(y2) +
           "\" stroke=\"" + stroke + "\"" + (dashed ? " stroke-dasharray=\"4 3\"" : "") + "/>";
}

void SvgCanvas::polyline(const std::vector<std::pair<double, double>>& points,
                         const std::string& stroke, const std::string& css_class) {
  if (points.size() < 2) return;
  body_ += "<polyline class=\"" + css_class + "\" fill=\"none\" stroke=\"" + stroke +
           "\" points=\"";
  for (size_t i = 0; i < points.size(); ++i) {
    if (i != 0) body_ += ' ';
    body_ += svg_number(points[i].first) + "," + svg_number(points[i].second);
  }
  body_ += "\"/>";
}

void SvgCanvas::text(double x, double y, const std::string& text, const std::string& css_class,
                     const char* anchor) {
  body_ += "<text class=\"" + css_class + "\" x=\"" + svg_number(x) + "\" y=\"" + svg_number(y) +
           "\" text-anchor=\"" + anchor + "\">" + html_escape(text) + "</text>";
}

void SvgCanvas::open_group(const std::string& css_class, const std::string& tooltip) {
  body_ += "<g class=\"" + css_class + "\">";
  if (!tooltip.empty()) body_ += "<title>" + html_escape(tooltip) + "</title>";
}

void SvgCanvas::close_group() { body_ += "</g>"; }

std::string SvgCanvas::finish() const {
  return "<svg class=\"" + css_class_ + "\" viewBox=\"0 0 " + svg_number(frame_.width) + " " +
         svg_number(frame_.height) + "\" role=\"img\">" +
         "<title>" + html_escape(title_) + "</title>" + body_ + "</svg>";
}

void draw_y_axis(SvgCanvas& svg, const LinearScale& y, const std::vector<double>& ticks,
                 const std::function<std::string(double)>& label) {
  const Frame& f = svg.frame();
  for (double tick : ticks) {
    const double at = y(tick);
    svg.line(f.plot_left(), at, f.plot_right(), at, "#e6e8eb", "grid");
    svg.text(f.plot_left() - 6, at + 4, label(tick), "tick", "end");
  }
}

void draw_time_axis(SvgCanvas& svg, const LinearScale& x, double origin, bool labels) {
  const Frame& f = svg.frame();
  svg.line(f.plot_left(), f.plot_bottom(), f.plot_right(), f.plot_bottom(), "#c4c8cf", "axis");
  const int count = static_cast<int>((f.plot_right() - f.plot_left()) / 110);
  for (double tick : time_ticks(x.domain_lo - origin, x.domain_hi - origin, count)) {
    const double at = x(tick + origin);
    svg.line(at, f.plot_bottom(), at, f.plot_bottom() + 4, "#c4c8cf", "axis");
    if (labels) svg.text(at, f.plot_bottom() + 16, time_label(tick), "tick", "middle");
  }
}

}  // namespace zerowait::observe
