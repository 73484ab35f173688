// Building blocks of the report's inline SVG charts: a canvas with a plot area, linear scales,
// round ticks, axes, rectangles and lines. Pure string building: no script, no fonts loaded,
// colours given on each element so a chart looks the same wherever the SVG is pasted.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace zerowait::observe {

// Maps [domain_lo, domain_hi] onto [range_lo, range_hi]; a zero-width domain maps to range_lo.
struct LinearScale {
  double domain_lo = 0;
  double domain_hi = 1;
  double range_lo = 0;
  double range_hi = 1;
  double operator()(double value) const;
};

// A chart's viewBox (width x height) and its plot area inside the margins. Charts that share a
// time axis use the same width and horizontal margins, so their x coordinates line up.
struct Frame {
  double width = 1000;
  double height = 120;
  double left = 64;
  double right = 16;
  double top = 10;
  double bottom = 24;
  double plot_left() const { return left; }
  double plot_right() const { return width - right; }
  double plot_top() const { return top; }
  double plot_bottom() const { return height - bottom; }
};

// About `count` values from lo to hi at a round step (1, 2 or 5 x 10^k), lo and hi included
// when they fall on it. Empty when hi <= lo.
std::vector<double> nice_ticks(double lo, double hi, int count);
// The smallest round value (1, 2, 2.5, 5 x 10^k) >= value; 1 for value <= 0.
double nice_ceiling(double value);
// Ticks for seconds on a time axis: round seconds, or whole minutes and hours on long runs.
std::vector<double> time_ticks(double lo, double hi, int count);
// A time axis label: "0 s", "45 s", "2:30", "1:02:00".
std::string time_label(double seconds);

class SvgCanvas {
 public:
  // `title` is read by screen readers and shown nowhere else.
  SvgCanvas(const Frame& frame, const std::string& title, const std::string& css_class);

  const Frame& frame() const { return frame_; }

  // `tooltip` (plain text, escaped here) appears on hover, without script.
  void rect(double x, double y, double width, double height, const std::string& fill,
            const std::string& css_class, const std::string& tooltip = "");
  void line(double x1, double y1, double x2, double y2, const std::string& stroke,
            const std::string& css_class, bool dashed = false);
  // One polyline through `points` (x, y in viewBox units); nothing for fewer than two points.
  void polyline(const std::vector<std::pair<double, double>>& points, const std::string& stroke,
                const std::string& css_class);
  // `anchor`: "start", "middle" or "end". `text` is escaped here.
  void text(double x, double y, const std::string& text, const std::string& css_class,
            const char* anchor = "start");
  void open_group(const std::string& css_class, const std::string& tooltip = "");
  void close_group();

  // The <svg> element, scaled to the page's width.
  std::string finish() const;

 private:
  Frame frame_;
  std::string body_;
  std::string title_;
  std::string css_class_;
};

// Horizontal grid lines across the plot and their labels left of it.
void draw_y_axis(SvgCanvas& svg, const LinearScale& y, const std::vector<double>& ticks,
                 const std::function<std::string(double)>& label);
// Labels under the plot for a time axis; `origin` is the t shown as 0.
void draw_time_axis(SvgCanvas& svg, const LinearScale& x, double origin, bool labels);

}  // namespace zerowait::observe
